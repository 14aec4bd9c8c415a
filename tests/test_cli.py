"""The command line without a browser: --version, settings from the environment, `serve` on a
taken port, and `train` failing fast with one JSON object and the right exit code."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from andrea import __version__


def andrea(*args, timeout=60, env=None):
    return subprocess.run([sys.executable, "-m", "andrea", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_version():
    r = andrea("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"andrea {__version__}"


def test_help_lists_the_commands_without_promising_later_ones():
    out = andrea("--help").stdout
    assert all(c in out for c in ("serve", "train", "export")) and "later" not in out


def test_serve_on_a_taken_port_fails_before_promising_a_url(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = andrea("serve", "--port", str(port), "--data-dir", str(tmp_path), "--no-warm-data")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot listen on 127.0.0.1:" in r.stderr
    assert "open http" not in r.stdout


def test_settings_come_from_the_environment(tmp_path, monkeypatch):
    from andrea.config import Settings

    monkeypatch.setenv("ANDREA_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("ANDREA_PORT", "8123")
    monkeypatch.setenv("ANDREA_HOST", "localhost")
    s = Settings()
    assert (s.data_dir, s.port, s.host) == (tmp_path / "d", 8123, "localhost")
    assert Settings(port=9000).port == 9000   # flags (arguments) win over the environment


def test_default_data_dir_is_the_user_data_folder(monkeypatch):
    import platformdirs

    from andrea.config import Settings

    monkeypatch.delenv("ANDREA_DATA_DIR", raising=False)
    assert str(Settings().data_dir) == platformdirs.user_data_dir("andrea", appauthor=False)


def test_train_refuses_a_bad_config_with_exit_2_and_one_json_object():
    r = andrea("train", "--steps", "0", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()
    result = json.loads(line)
    assert not result["ok"] and "steps" in result["error"]


def test_train_against_a_closed_port_fails_within_seconds():
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The subprocess timeout is the bound (5 s) plus interpreter start-up: a CLI that
    # waited on the dead server would blow it.
    r = andrea("train", "--server", f"http://127.0.0.1:{port}", "--json", timeout=15)
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()
    result = json.loads(line)
    assert not result["ok"] and "does not answer" in result["error"]
    assert result["server"] == f"http://127.0.0.1:{port}"


def test_train_flags_cover_every_run_config_field():
    from andrea.run_config import RunConfig

    out = andrea("train", "--help").stdout
    for name in RunConfig.model_fields:
        flag = "--branch" if name == "parent" else "--" + name.replace("_", "-")
        assert flag in out, name
