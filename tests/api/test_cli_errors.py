"""Every bad setting is one line on stderr, exit 2, no traceback: which setting (the flag, the
ANDREA_* variable or the --room option), what was given and what is allowed. Run through the
real console script; every Settings field is covered in-process, from the model itself. And a
failed `andrea train` without --json says why in a sentence, never a table of Nones or a dict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from andrea.cli.bad_settings import BadSetting, allowed, load_settings
from andrea.cli.launch import free_port
from andrea.config import Settings


def andrea(*args, env=None, timeout=60):
    """The `andrea` console script next to this interpreter (python -m andrea where there is
    none), with ANDREA_* settings of the caller's environment left out unless given."""
    script = Path(sys.executable).with_name("andrea")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "andrea"]
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("ANDREA_")}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                          env={**clean, **(env or {})})


def one_line(r, command: str, code: int = 2) -> str:
    """The contract: exit `code`, no traceback, exactly one stderr line naming the command;
    that line's reason."""
    assert r.returncode == code, r.stdout + r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"andrea {command}: "), line
    return line.removeprefix(f"andrea {command}: ")


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "hostname"
    path.write_text("not a folder\n")
    return path


# ---- andrea serve: flags and ANDREA_* ---------------------------------------------------------

@pytest.mark.parametrize("args, env, said", [
    (["--port", "99999"], {}, "--port 99999: must be an integer from 0 to 65535"),
    (["--port", "abc"], {}, "--port abc: must be an integer from 0 to 65535"),
    ([], {"ANDREA_PORT": "abc"}, "ANDREA_PORT='abc': must be an integer from 0 to 65535"),
    ([], {"ANDREA_START_GRACE_S": "x"}, "ANDREA_START_GRACE_S='x': must be a number above 0"),
    ([], {"ANDREA_CHECKPOINTS_KEPT": "0"},
     "ANDREA_CHECKPOINTS_KEPT='0': must be an integer of at least 1"),
    ([], {"ANDREA_LOCAL_OWNER": "maybe"},
     "ANDREA_LOCAL_OWNER='maybe': must be true or false (or 1 or 0, yes or no, on or off)"),
    ([], {"ANDREA_CORPORA": "[1]"},
     "ANDREA_CORPORA='[1]': must be a JSON list of [\"NAME\", \"PATH\"] pairs"),
    # Two at once: both, in the one line.
    ([], {"ANDREA_PORT": "-1", "ANDREA_MAX_RUNS": "none"},
     "ANDREA_PORT='-1': must be an integer from 0 to 65535; "
     "ANDREA_MAX_RUNS='none': must be an integer of at least 1"),
    # A flag wins over its variable: the flag's value is the one checked.
    (["--port", "8000", "--workers", "0"], {"ANDREA_PORT": "abc"},
     "argument --workers: '0': must be an integer of at least 1 (see andrea serve --help)"),
])
def test_serve_says_which_setting_is_bad_in_one_line(args, env, said):
    assert one_line(andrea("serve", "--no-warm-data", *args, env=env), "serve") == said


def test_a_variable_that_is_not_json_says_where(tmp_path):
    said = one_line(andrea("serve", env={"ANDREA_CORPORA": "[[\"a\", "}), "serve")
    assert said.startswith("ANDREA_CORPORA='[[\"a\", ': not JSON: expecting value at "
                           "character 8 (after '[[\"a\", ')"), said
    assert said.endswith('must be a JSON list of ["NAME", "PATH"] pairs'), said


def test_a_data_dir_that_is_a_file_is_said_before_anything_opens_it(a_file):
    assert one_line(andrea("serve", "--data-dir", str(a_file)), "serve") == \
        f"--data-dir {a_file}: must be a folder, not a file"
    assert one_line(andrea("serve", "--data-dir", str(a_file / "sub")), "serve") == \
        f"--data-dir {a_file / 'sub'}: must be a folder, and {a_file} is a file"
    assert one_line(andrea("serve", env={"ANDREA_DATA_DIR": str(a_file)}), "serve") == \
        f"ANDREA_DATA_DIR={str(a_file)!r}: must be a folder, not a file"
    assert one_line(andrea("serve", env={"ANDREA_CACHE_DIR": str(a_file)}), "serve") == \
        f"ANDREA_CACHE_DIR={str(a_file)!r}: must be a folder, not a file"


def test_a_usage_error_is_one_line_too():
    r = andrea("serve", "--bogus")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "andrea: unrecognized arguments: --bogus (see andrea --help)"


# ---- every Settings field, from the model (in-process) ---------------------------------------

def bad_values(prop: dict) -> list[str]:
    """Values a field of this JSON schema refuses, as ANDREA_* would give them."""
    kind = next((p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"), {})
    out = {"integer": ["x", "1.5"], "number": ["x"], "boolean": ["maybe"],
           "array": ["{"]}.get(kind.get("type"), [])
    if kind.get("type") in ("integer", "number"):
        if "minimum" in kind:
            out.append(str(kind["minimum"] - 1))
        if "exclusiveMinimum" in kind:
            out.append(str(kind["exclusiveMinimum"]))
        if "maximum" in kind:
            out.append(str(kind["maximum"] + 1))
    return out


def test_every_settings_field_is_named_with_its_value_and_what_is_allowed(monkeypatch):
    """A new field is covered with no word in the CLI: each value pydantic refuses is said as
    ANDREA_<FIELD>='<value>': <what is allowed>, and as --<flag> <value> when a flag gave it."""
    for k in list(os.environ):
        if k.upper().startswith("ANDREA_"):
            monkeypatch.delenv(k)
    props = Settings.model_json_schema()["properties"]
    checked = set()
    for field, prop in props.items():
        env = f"ANDREA_{field.upper()}"
        for value in bad_values(prop):
            monkeypatch.setenv(env, value)
            try:
                Settings()
                continue        # (allowed_hosts takes any text: a comma-separated list)
            except ValueError:  # pydantic's ValidationError, pydantic-settings' SettingsError
                pass
            with pytest.raises(BadSetting) as e:
                load_settings()
            said = str(e.value)
            assert "\n" not in said and said.startswith(f"{env}={value!r}: "), said
            words = allowed(prop)
            assert words and f"must be {words}" in said, said
            checked.add(field)
            monkeypatch.delenv(env)
    typed = {f for f, p in props.items() for k in p.get("anyOf", [p])
             if k.get("type") in ("integer", "number", "boolean")}
    assert typed <= checked and len(checked) >= 30, sorted(typed - checked)
    # A flag: its name and the value given, not the variable's.
    monkeypatch.setenv("ANDREA_PORT", "abc")
    with pytest.raises(BadSetting) as e:
        load_settings({"port": "--port"}, port="70000")
    assert str(e.value) == "--port 70000: must be an integer from 0 to 65535"


def test_every_folder_setting_refuses_a_file(monkeypatch, a_file):
    for field in Settings.model_fields:
        if field.endswith("_dir"):
            monkeypatch.setenv(f"ANDREA_{field.upper()}", str(a_file))
            with pytest.raises(BadSetting, match=f"^ANDREA_{field.upper()}=.*must be a folder"):
                load_settings()
            monkeypatch.delenv(f"ANDREA_{field.upper()}")


@pytest.mark.parametrize("field, value, form", [
    ("database_url", "sqlite:///x.db", "postgresql://user@host:port/database"),
    ("database_url", "not a url", "postgresql://user@host:port/database"),
    ("broker_url", "localhost:6379", "redis://host:port/db (or rediss://, unix://)"),
])
def test_a_url_setting_in_the_wrong_form_is_said_before_it_is_opened(monkeypatch, field, value,
                                                                     form):
    env = f"ANDREA_{field.upper()}"
    monkeypatch.setenv(env, value)
    with pytest.raises(BadSetting) as e:
        load_settings()
    assert str(e.value) == f"{env}={value!r}: must be {form}"
    monkeypatch.setenv(env, {"database_url": "postgresql://u@db:5432/andrea",
                             "broker_url": "redis://broker:6379/0"}[field])
    assert getattr(load_settings(), field)      # the right form passes (nothing is connected)


def test_a_variable_spelled_in_lower_case_is_named_as_spelled(monkeypatch):
    """pydantic-settings reads ANDREA_* whatever its case: the error names the one set."""
    for k in list(os.environ):
        if k.upper().startswith("ANDREA_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("andrea_port", "abc")
    with pytest.raises(BadSetting, match=r"^andrea_port='abc': must be an integer"):
        load_settings()


# ---- andrea train: --room, the config flags, the server it starts -------------------------------

@pytest.mark.parametrize("room, said", [
    ("{bad", "--room '{bad': not JSON: expecting property name enclosed in double quotes at "
             "character 2 (after '{')"),
    ('{"codec": "int8",\n "quorum": }',
     "--room '{\"codec\": \"int8\",\n \"quorum\": }': not JSON: expecting value at line 2 "
     "column 12 (after ...'ec\": \"int8\",\\n \"quorum\": ')"),
    ('{"codec": "x"}', '--room codec "x": must be one of "int8", "f16", "f32"'),
    ('{"inner_steps": "50"}', '--room inner_steps "50": must be an integer from 1 to 100000'),
    ('{"outer_momentum": 1}', "--room outer_momentum 1: must be a number of at least 0 and "
                              "below 1"),
    ('{"quorum": 5, "max_workers": 2}', "--room: quorum (5) exceeds max_workers (2)"),
    ("[1]", "--room '[1]': must be a JSON object of room options, e.g. "
            "'{\"inner_steps\": 50, \"codec\": \"int8\"}'"),
])
def test_room_json_errors_say_where_and_what(room, said):
    r = andrea("train", "--room", room, "--json")
    reason = one_line(r, "train")
    assert reason == " ".join(said.split()), reason     # (the line's whitespace is collapsed)
    (line,) = r.stdout.strip().splitlines()       # --json: still its one JSON object
    assert json.loads(line)["error"] == reason


def test_an_unknown_room_option_is_named_with_those_there_are():
    from andrea.run_config import RoomConfig

    said = one_line(andrea("train", "--room", '{"workers": 4}'), "train")
    assert said.startswith('--room: no option "workers": the room options are '), said
    assert all(name in said for name in RoomConfig.model_fields)


def test_train_help_explains_every_room_option_from_the_model():
    from andrea.run_config import RoomConfig

    out = andrea("train", "--help").stdout
    flat = " ".join(out.split())
    assert "see RoomConfig" not in flat and "room options" in flat
    for name, field in RoomConfig.model_fields.items():
        entry = next((ln for ln in out.splitlines() if ln.strip().startswith(name + " ")), None)
        assert entry, name
        if field.description:
            assert " ".join(field.description.split()) in flat, name
        assert f"default {json.dumps(field.default)}" in flat, name


@pytest.mark.parametrize("args, said", [
    (["--steps", "0"], "--steps 0: must be an integer from 1 to 1000000"),
    (["--lr", "nan"], "--lr nan: must be a number above 0 and at most 1"),
    (["--seq-len", "1"], "--seq-len 1: must be an integer from 2 to 8192"),
])
def test_a_config_flag_out_of_bounds_says_what_is_allowed(args, said):
    r = andrea("train", *args, "--json")
    assert one_line(r, "train") == said
    assert json.loads(r.stdout)["error"] == said


def test_a_config_flag_that_is_no_number_is_one_line():
    said = one_line(andrea("train", "--steps", "abc"), "train")
    assert said == ("argument --steps: 'abc': must be an integer from 1 to 1000000 "
                    "(see andrea train --help)")


@pytest.mark.parametrize("env, args, said", [
    ({"ANDREA_START_GRACE_S": "x"}, [], "ANDREA_START_GRACE_S='x': must be a number above 0"),
    ({"ANDREA_MAX_RUNS": "0"}, [], "ANDREA_MAX_RUNS='0': must be an integer of at least 1"),
])
def test_the_server_train_would_start_has_its_settings_checked_first(env, args, said):
    """Before the browser (missing here) and before any server starts; ANDREA_PORT plays no
    part: that server gets a free port."""
    r = andrea("train", *args, "--json",
               env={**env, "ANDREA_CHROMIUM": "/nonexistent/chrome"})
    assert one_line(r, "train") == said
    assert json.loads(r.stdout)["server"] is None
    r = andrea("train", "--server", "http://127.0.0.1:9", "--json", timeout=30,
               env={**env, "ANDREA_CHROMIUM": "/nonexistent/chrome"})
    assert "no browser at" in one_line(r, "train", code=1)    # another's server: not its settings


def test_train_and_export_refuse_a_data_dir_that_is_a_file(a_file):
    r = andrea("train", "--data-dir", str(a_file), env={"ANDREA_CHROMIUM": "/nonexistent/chrome"})
    assert one_line(r, "train") == f"--data-dir {a_file}: must be a folder, not a file"
    r = andrea("export", "abc", "--data-dir", str(a_file))
    assert one_line(r, "export") == f"--data-dir {a_file}: must be a folder, not a file"
    r = andrea("export", "abc", env={"ANDREA_CHECKPOINTS_KEPT": "none"})
    assert one_line(r, "export") == "ANDREA_CHECKPOINTS_KEPT='none': must be an integer of at " \
                                    "least 1"


# ---- a failed andrea train, without --json ---------------------------------------------------

def test_a_failed_train_says_why_in_a_sentence_not_a_table():
    port = free_port()   # a port nothing listens on
    r = andrea("train", "--server", f"http://127.0.0.1:{port}", timeout=30,
               env={"ANDREA_CHROMIUM": "/bin/false"})
    said = one_line(r, "train", code=1)
    assert said.startswith(f"the server at http://127.0.0.1:{port} does not answer: "), said
    assert r.stdout == ""      # nothing known but why: no table of None values


def test_the_result_in_words_has_no_none_and_no_dict():
    from andrea.cli.train_output import summary

    failed = {"ok": False, "run_id": "r1", "server": "http://127.0.0.1:8000", "data_dir": None,
              "resume_link": "http://127.0.0.1:8000/runs/r1#token=t", "status": "failed",
              "steps": 0, "final_loss": None, "final_grad_norm": None, "median_step_ms": None,
              "adapter": None, "readback": None, "error": "Cannot train here: no"}
    assert summary(failed) == ["run r1 on http://127.0.0.1:8000: failed, 0 steps",
                               "resume link: http://127.0.0.1:8000/runs/r1#token=t"]
    finished = {**failed, "ok": True, "status": "finished", "steps": 200, "final_loss": 2.34567,
                "final_grad_norm": 0.8123, "median_step_ms": 12.34,
                "adapter": {"vendor": "google", "architecture": "swiftshader", "fallback": True},
                "readback": {"ringWaits": 3, "loop": {"encode": [1, 2]}}}
    del finished["error"]
    text = "\n".join(summary(finished))
    assert text.splitlines()[0] == ("run r1 on http://127.0.0.1:8000: finished, 200 steps, final "
                                    "loss 2.3457, grad norm 0.812, median step 12.3 ms, on "
                                    "google swiftshader (software)")
    room = {"ok": True, "run_id": "r2", "server": "http://h", "status": "finished",
            "version": 4, "rounds": 4, "workers": 2, "sent_bytes": 3 << 20,
            "join_link": "http://h/runs/r2#join=j", "readback": {"ringWaits": 0}}
    assert summary(room) == ["room run r2 on http://h: finished, version 4 of 4 rounds, "
                             "2 worker(s), 3.0 MiB of pseudo-gradients sent from here",
                             "join link: http://h/runs/r2#join=j"]
    for result in (failed, finished, room):
        words = "\n".join(summary(result))
        assert "None" not in words and "{" not in words and "ringWaits" not in words
    assert summary({"ok": False, "run_id": None, "server": None, "error": "x"}) == []
