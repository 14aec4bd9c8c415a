"""The command line without a browser: --version, settings from the environment, `serve` on a
taken port, and `train` failing fast with one stderr line, one JSON object and the right exit
code (no browser, one that does not start, Playwright broken, a page that cannot train), never
leaving a run `created`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
import pytest

from andrea import __version__
from andrea.cli.launch import free_port
from tests.servers import serve

# How long a command may take before the test calls it hung: a guard, not a measure (a test
# never passes or fails on speed), so generous enough for a machine running two suites at once.
HUNG_S = 300


def andrea(*args, timeout=HUNG_S, env=None):
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


def test_train_against_a_closed_port_fails_with_its_reason():
    port = free_port()   # a port nothing listens on
    # /bin/false as the browser: a given server is asked before any browser is started.
    r = andrea("train", "--server", f"http://127.0.0.1:{port}", "--json",
               env=env_with(ANDREA_CHROMIUM="/bin/false"))
    result = one_failure(r)
    assert "does not answer" in result["error"]
    assert result["server"] == f"http://127.0.0.1:{port}"


def test_train_flags_cover_every_run_config_field():
    from andrea.run_config import RunConfig

    out = andrea("train", "--help").stdout
    for name in RunConfig.model_fields:
        flag = "--branch" if name == "parent" else "--" + name.replace("_", "-")
        assert flag in out, name


def test_train_takes_the_clip_mode_and_refuses_another():
    import argparse

    from andrea.cli.train_args import add_train_arguments, run_config

    out = " ".join(andrea("train", "--help").stdout.split())
    assert "--clip-mode {global,per_tensor,off}" in out and "--clip " not in out
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--clip-mode", "per_tensor", "--max-norm", "0.5"])
    assert run_config(args) == {"clip_mode": "per_tensor", "max_norm": 0.5, "preset": "tiny"}
    r = andrea("train", "--clip-mode", "sometimes", "--json")
    assert r.returncode == 2 and "--clip-mode" in r.stderr and "invalid choice" in r.stderr


# ---- train: every failure is one stderr line, one JSON object, exit 1, and no run left created --


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of this module's own, so "no run was created" can be checked against it."""
    with serve(tmp_path_factory.mktemp("cli-data")) as s:
        yield s.url


def runs_on(url: str) -> list[dict]:
    import httpx

    return httpx.get(f"{url}/api/runs").json()


def env_with(**changes):
    import os

    return {**os.environ, **changes}


def one_failure(r, code=1) -> dict:
    """The failure contract: exit `code`, exactly one stderr line naming the command, exactly one
    JSON object on stdout whose error is that line's reason; no traceback anywhere."""
    assert r.returncode == code, r.stdout + r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    (err,) = r.stderr.strip().splitlines()
    (line,) = r.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["ok"] is False and err == f"andrea train: {result['error']}", (err, result)
    return result


def test_train_help_names_the_browser_and_needs_no_playwright_download():
    out = " ".join(andrea("train", "--help").stdout.split())
    assert "/usr/bin/chromium" in out and "ANDREA_CHROMIUM" in out
    assert "browser download is not needed" in out


def test_train_without_the_browser_says_so_before_creating_a_run(server):
    r = andrea("train", "--server", server, "--steps", "2", "--json",
               env=env_with(ANDREA_CHROMIUM="/nonexistent/chrome"))
    result = one_failure(r)
    assert "no browser at ANDREA_CHROMIUM=/nonexistent/chrome" in result["error"]
    assert "apt-get install chromium" in result["error"]
    assert result["run_id"] is None and runs_on(server) == []


def test_train_without_the_browser_starts_no_server(tmp_path):
    r = andrea("train", "--data-dir", str(tmp_path / "d"), "--json",
               env=env_with(ANDREA_CHROMIUM="/nonexistent/chrome"))
    result = one_failure(r)
    assert result["server"] is None and not (tmp_path / "d").exists()


def test_train_without_the_browser_in_plain_mode_is_one_line_too(server):
    r = andrea("train", "--server", server,
               env=env_with(ANDREA_CHROMIUM="/nonexistent/chrome"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (err,) = r.stderr.strip().splitlines()
    assert err.startswith("andrea train: no browser at ANDREA_CHROMIUM=/nonexistent/chrome")


def test_the_default_browser_missing_names_apt_and_andrea_chromium(monkeypatch):
    from andrea.cli import chromium

    monkeypatch.delenv("ANDREA_CHROMIUM", raising=False)
    monkeypatch.setattr(chromium, "DEFAULT_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(chromium.BrowserError) as e:
        chromium.find_chromium()
    assert "no browser at /nonexistent/chromium" in str(e.value)
    assert "apt-get install chromium" in str(e.value) and "ANDREA_CHROMIUM" in str(e.value)


def test_dawn_toggles_given_in_andrea_chromium_args_add_to_those_gpu_needs(monkeypatch):
    """Chromium reads only the last --enable-dawn-features: one given in ANDREA_CHROMIUM_ARGS
    must not drop mixed precision's toggles on --gpu (nor its own other flags)."""
    from andrea.cli import browser_flags
    from andrea.run_config import MIXED_DAWN_TOGGLES

    monkeypatch.setenv("ANDREA_CHROMIUM_ARGS", "--enable-dawn-features=dump_shaders --foo "
                       "--enable-dawn-features=allow_unsafe_apis,disable_robustness")
    args = browser_flags.webgpu_args(gpu=True)
    features = [a for a in args if a.startswith("--enable-dawn-features=")]
    assert features == ["--enable-dawn-features=" + ",".join(
        [*MIXED_DAWN_TOGGLES, "dump_shaders", "disable_robustness"])]
    assert "--foo" in args and args.index(features[0]) < args.index("--foo")
    monkeypatch.setenv("ANDREA_CHROMIUM_ARGS", "--enable-dawn-features=dump_shaders")
    assert "--enable-dawn-features=dump_shaders" in browser_flags.webgpu_args(gpu=False)


def test_train_with_a_file_that_is_no_browser(server, tmp_path):
    not_executable = tmp_path / "chrome"
    not_executable.write_text("not a browser")
    r = andrea("train", "--server", server, "--json",
               env=env_with(ANDREA_CHROMIUM=str(not_executable)))
    assert "is not an executable file" in one_failure(r)["error"]
    assert runs_on(server) == []


def test_train_with_a_browser_that_will_not_start(server):
    # /bin/false runs and exits at once: Playwright's launch fails (a page of call log), the
    # command says so in one line, and no run is created.
    r = andrea("train", "--server", server, "--json",
               env=env_with(ANDREA_CHROMIUM="/bin/false"))
    error = one_failure(r)["error"]
    assert "ANDREA_CHROMIUM=/bin/false did not start: it exited at once with code 1" in error
    assert runs_on(server) == []


def test_train_with_playwright_broken(server, tmp_path):
    # A `playwright` that fails to import shadows the installed one, as a broken install would.
    (tmp_path / "playwright").mkdir()
    (tmp_path / "playwright" / "__init__.py").write_text(
        "raise ImportError('libgreenlet.so: cannot open shared object file')")
    r = andrea("train", "--server", server, "--json",
               env=env_with(PYTHONPATH=str(tmp_path)))
    error = one_failure(r)["error"]
    assert error.startswith("Playwright cannot be imported (ImportError: libgreenlet.so")
    assert runs_on(server) == []


def test_the_same_error_seen_twice_is_said_once():
    from andrea.cli.train_output import one_reason

    why = "this GPU cannot run it: the logits activation needs 2048 MiB at batch 64 x 1024"
    assert one_reason([f"page error: {why}", f"Cannot train here: {why}", None]) == \
        f"Cannot train here: {why}"
    assert one_reason([f"page error: Error: {why}", f"Cannot train here: {why}"]) in \
        (f"page error: Error: {why}", f"Cannot train here: {why}")
    # A shorter message that a longer one contains goes; different errors all stay.
    assert one_reason(["page error: boom", "Training failed: boom at step 3"]) == \
        "Training failed: boom at step 3"
    assert one_reason(["GET /static/x.js: HTTP 404", "page error: y is not defined"]) == \
        "GET /static/x.js: HTTP 404; page error: y is not defined"
    assert one_reason(["a\nb", "a b"]) == "a b"


class PageThatCannotTrain:
    """Stands in for andrea.cli.chromium.Chromium: the browser starts and has an adapter, but the
    page fails before the run's first step, as on a GPU that cannot hold the run."""
    gpu = False
    path = "/usr/bin/chromium"
    version = "fake"
    drive_raises = None

    def __init__(self, gpu=False):
        pass

    def check(self):
        pass

    def launch(self):
        pass

    def probe(self):
        return {"vendor": "fake", "architecture": "", "fallback": True}

    def drive(self, url, run, timeout, tick):
        assert tick() is None   # the server answers
        if self.drive_raises:
            raise self.drive_raises
        why = "this GPU cannot run it: no"
        return {"done": "failed", "errors": [f"page error: {why}"],
                "error_text": f"Cannot train here: {why}", "stats": None, "interrupted": False}

    def close(self):
        pass


def train_in_process(monkeypatch, capsys, fake, *args) -> tuple[int, dict, str]:
    from andrea.cli import headless
    from andrea.cli import main as cli

    monkeypatch.setattr(headless, "Chromium", fake)
    code = cli.main(["train", *args, "--json"])
    out, err = capsys.readouterr()
    (line,) = out.strip().splitlines()
    return code, json.loads(line), err


def test_a_run_the_page_could_not_train_is_failed_not_left_created(server, monkeypatch, capsys):
    import httpx

    code, result, err = train_in_process(monkeypatch, capsys, PageThatCannotTrain,
                                         "--server", server, "--steps", "2")
    assert code == 1 and not result["ok"] and result["status"] == "failed", result
    assert result["error"] == "Cannot train here: this GPU cannot run it: no"   # said once
    assert [ln for ln in err.splitlines() if ln.startswith("andrea train:")] == \
        [f"andrea train: {result['error']}"]
    run = httpx.get(f"{server}/api/runs/{result['run_id']}").json()
    assert (run["status"], run["message"]) == ("failed", result["error"])


@pytest.mark.parametrize("raised, said", [
    ("browser", "the browser went away: Target crashed"),        # the browser fails
    ("bug", "unexpected ZeroDivisionError: division by zero"),   # a defect of ours
])
def test_a_failure_after_the_run_exists_is_one_line_and_fails_the_run(server, monkeypatch,
                                                                        capsys, raised, said):
    import httpx

    from andrea.cli.chromium import BrowserError

    class Failing(PageThatCannotTrain):
        drive_raises = BrowserError("the browser went away: Target crashed") \
            if raised == "browser" else ZeroDivisionError("division by zero")

    code, result, err = train_in_process(monkeypatch, capsys, Failing, "--server", server,
                                         "--steps", "2")
    assert code == 1 and result["status"] == "failed" and result["error"] == said
    assert "Traceback" not in err
    run = httpx.get(f"{server}/api/runs/{result['run_id']}").json()
    assert (run["status"], run["message"]) == ("failed", said)


def test_a_page_refused_for_good_is_one_line_and_leaves_the_run_to_its_new_trainer(
        server, monkeypatch, capsys):
    """The run is taken over (resumed elsewhere) while the page trains it: the server refuses
    the page's socket for good, the page ends `failed` with the reason (training.js), and
    `andrea train` exits 1 with that reason as its one error line; the revoked token is not
    used again to mark the run, which is now the new trainer's."""
    import httpx

    reason = "this run was resumed elsewhere; this tab's token was revoked"

    class TakenOver(PageThatCannotTrain):
        def drive(self, url, run, timeout, tick):
            assert tick() is None
            said = f"Training stopped: the server refused this tab's trainer ({reason})"
            return {"done": "failed", "errors": [], "error_text": said, "stats": None,
                    "interrupted": False, "refused": reason}

    code, result, err = train_in_process(monkeypatch, capsys, TakenOver, "--server", server,
                                         "--steps", "2")
    assert code == 1 and not result["ok"], result
    assert result["error"] == f"Training stopped: the server refused this tab's trainer ({reason})"
    assert [ln for ln in err.splitlines() if ln.startswith("andrea train:")] == \
        [f"andrea train: {result['error']}"]
    assert "could not mark" not in err
    run = httpx.get(f"{server}/api/runs/{result['run_id']}").json()
    assert run["status"] == "created", run   # not marked failed with the refused token


def test_the_resume_link_of_a_server_that_stops_with_the_command_says_so(
        server, monkeypatch, capsys, tmp_path):
    """Without --server the link names the command's own server, gone once it exits: it says
    so and how to resume later (in --json too, still one object). The commands it names
    parse. With --server (or a server already on the data dir) the link outlives the command."""
    import shlex

    from andrea.cli.main import build_parser

    data = tmp_path / "my data"
    code, result, err = train_in_process(monkeypatch, capsys, PageThatCannotTrain,
                                         "--data-dir", str(data), "--steps", "2", "--gpu")
    assert code == 1 and result["run_id"] and result["resume_link"], result
    run_id, where = result["run_id"], shlex.quote(str(data.resolve()))
    hint = result["resume_hint"]
    assert hint.startswith("this server stops when andrea train exits: to resume later"), hint
    assert f"`andrea serve --data-dir {where}` and open /runs/{run_id} there" in hint
    resume = f"andrea train --resume {run_id} --data-dir {where} --gpu"
    assert f"`{resume}`" in hint and f"({hint})" in err.splitlines()
    args = build_parser().parse_args(shlex.split(resume)[1:])
    assert (args.resume, args.data_dir, args.server) == (run_id, data.resolve(), None)
    build_parser().parse_args(["serve", "--data-dir", str(data)])
    _, result, err = train_in_process(monkeypatch, capsys, PageThatCannotTrain,
                                      "--server", server, "--steps", "2")
    assert result["resume_link"] and "resume_hint" not in result and "stops when" not in err


def test_a_resumed_run_that_never_trained_stays_resumable(server):
    # Failed is final; a resumed run keeps its checkpoint, so it is marked stopped instead.
    import httpx

    from andrea.cli.headless import _settle_untrained
    from tests.trainer_client import new_run

    run = new_run(server, steps=2)
    result = {"run_id": run["id"], "server": server}
    _settle_untrained(result, {"token": run["token"]}, "no adapter", resumed=True)
    got = httpx.get(f"{server}/api/runs/{run['id']}").json()
    assert result["status"] == got["status"] == "stopped" and got["message"] == "no adapter"


def test_the_http_client_words_fastapi_errors_and_a_server_that_does_not_answer(server):
    """One client for `andrea train` and `andrea export --server` (andrea.cli.http_client)."""
    from andrea.cli import http_client

    with pytest.raises(http_client.ServerError) as e:
        http_client.request("GET", f"{server}/api/runs/nope")
    assert e.value.status == 404 and "nope" in e.value.detail
    assert str(e.value) == f"GET /api/runs/nope: 404 {e.value.detail}"
    with pytest.raises(http_client.ServerError) as e:   # pydantic's errors: "where: why"
        http_client.request("POST", f"{server}/api/runs", {"preset": "tiny", "steps": 0})
    assert e.value.status == 422 and e.value.detail.startswith("steps: "), e.value.detail
    port = free_port()   # a port nothing listens on
    with pytest.raises(http_client.Unreachable) as e:
        http_client.request("GET", f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert str(e.value).startswith(f"the server at http://127.0.0.1:{port} does not answer: ")


def test_the_server_andrea_train_starts_is_not_shadowed_by_the_working_directory(
        tmp_path, monkeypatch):
    """Before: `cd ~ && andrea train ...` with a checkout cloned into ~/andrea: the server it
    started with `python -m andrea` imported that folder ("cannot import name '__version__'
    from 'andrea' (unknown location)")."""
    (tmp_path / "andrea" / "server").mkdir(parents=True)    # a checkout: no andrea/__init__.py
    monkeypatch.chdir(tmp_path)
    with serve(tmp_path / "data") as s:
        assert httpx.get(s.url + "/healthz", timeout=30).status_code == 200


def test_one_server_per_data_dir_and_andrea_train_uses_the_one_there(tmp_path):
    """Two servers on one data dir each showed the other's live runs as "no training tab"
    (with a Resume button) and dropped the other's branches mid-copy at their start. A second
    is refused, naming the first; `andrea train` without --server trains on the first."""
    import argparse

    from andrea.cli.headless import _start_server
    from andrea.data_dir_lock import holder

    data = tmp_path / "data"
    assert holder(data) is None
    with serve(data) as (proc, url, _):
        assert holder(data) == {"pid": proc.pid, "url": url + "/"}
        second = subprocess.run(
            [sys.executable, "-P", "-m", "andrea", "serve", "--data-dir", str(data), "--port",
             str(free_port()), "--no-warm-data"], capture_output=True, text=True, timeout=HUNG_S)
        assert second.returncode == 1, second.stderr
        assert f"at {url}/ is already serving the data dir" in second.stderr, second.stderr
        assert httpx.get(url + "/healthz").status_code == 200      # the first serves on
        result = {}
        assert _start_server(argparse.Namespace(data_dir=data), result) is None
        assert result["server"] == url
    assert holder(data) is None                 # freed with the process: a restart takes it
    with serve(data):
        pass


def test_a_server_bound_to_every_address_says_to_open_a_real_one():
    from andrea.cli.main import open_url
    assert open_url("0.0.0.0", 8000) == "http://127.0.0.1:8000/"     # it printed 0.0.0.0
    assert open_url("::", 8000) == "http://127.0.0.1:8000/"
    assert open_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/"
    assert open_url("::1", 8000) == "http://[::1]:8000/"


# ---- what the command does when it is stopped, cut off or given flags that contradict ----------


class PageThatTrains(PageThatCannotTrain):
    """The page trains a few steps through a real trainer socket, then returns `page`."""
    page: dict = {}

    def drive(self, url, run, timeout, tick, join_token=None):
        from websockets.sync.client import connect

        from andrea.cli.chromium import drive_result
        from tests.trainer_client import hello, record, send_records, ws_url

        with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
            assert hello(ws, run["token"])["type"] == "welcome"
            ws.send(json.dumps({"type": "status", "status": "running", "message": ""}))
            send_records(ws, 1, 3, 3, record, 0, lambda s: None)
        return drive_result(**self.page)


def test_a_run_past_its_timeout_is_stopped_not_left_running(server, monkeypatch, capsys):
    """--timeout: the page is stopped as on Ctrl-C; where it could not be (this stand-in's
    trainer is gone), the server is told: the run reads stopped, not running with nobody at it."""
    class TimedOut(PageThatTrains):
        page = {"timed_out": True}

    code, result, _ = train_in_process(monkeypatch, capsys, TimedOut, "--server", server,
                                       "--steps", "20", "--timeout", "1")
    assert code == 1 and result["status"] == "stopped", result
    assert result["error"] == "no result within 1 s: the run was stopped"
    run = httpx.get(f"{server}/api/runs/{result['run_id']}").json()
    assert run["status"] == "stopped" and "--timeout" in run["message"]


def test_ctrl_c_exits_130_even_with_the_server_gone(tmp_path, monkeypatch, capsys):
    with serve(tmp_path / "d") as server:

        class GoneThenInterrupted(PageThatTrains):
            def drive(self, url, run, timeout, tick, join_token=None):
                server.stop()               # the server goes away (a restart) ...
                from andrea.cli.chromium import drive_result
                return drive_result(interrupted=True)   # ... and the user presses Ctrl-C

        code, result, _ = train_in_process(monkeypatch, capsys, GoneThenInterrupted,
                                           "--server", server.url, "--steps", "2")
    assert (code, result["error"]) == (130, "interrupted"), result


def test_a_task_runs_eval_and_exact_match_reach_the_result_and_its_summary(server, monkeypatch,
                                                                         capsys):
    """A toy task run: --json's result has the last eval's loss and held-out exact match, and
    the summary says the match in words."""
    class TrainsATask(PageThatTrains):
        page = {"done": "finished"}

        def drive(self, url, run, timeout, tick, join_token=None):
            from websockets.sync.client import connect

            from andrea.cli.chromium import drive_result
            from tests.trainer_client import hello, record, send_records, ws_url

            def evaluated(step):     # evals at steps 2 and 3; the last one is the result's
                return {**record(step), **({"eval_loss": 1.5 - step / 4, "eval_acc": step / 4}
                                           if step >= 2 else {})}
            with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
                assert hello(ws, run["token"])["type"] == "welcome"
                ws.send(json.dumps({"type": "status", "status": "running", "message": ""}))
                send_records(ws, 1, 3, 3, evaluated, 0, lambda s: None)
            return drive_result(**self.page)

    code, result, _ = train_in_process(monkeypatch, capsys, TrainsATask, "--server", server,
                                       "--steps", "3", "--task", "reverse")
    assert code == 0, result
    assert (result["final_eval_loss"], result["final_eval_acc"]) == (0.75, 0.75), result
    from andrea.cli.train_output import summary
    line = summary(result)[0]
    assert "eval loss 0.7500" in line and "75.0% of held-out problems answered exactly" in line


@pytest.mark.parametrize("flags, said", [
    (["--branch", "no-such-run", "--preset", "tiny", "--room", '{"inner_steps": 5}'],
     "a room run cannot be a branch"),
    (["--resume", "abc123", "--join", "def456"], "--resume and --join exclude each other"),
    (["--branch", "abc123", "--join", "def456"], "--branch and --join exclude each other"),
])
def test_flags_of_two_runs_are_refused_not_one_dropped(server, monkeypatch, capsys, flags, said):
    code, result, _ = train_in_process(monkeypatch, capsys, PageThatTrains, "--server", server,
                                       *flags)
    assert code == 2 and said in result["error"] and result["run_id"] is None, result


class PageThatTrainsARoom(PageThatCannotTrain):
    """The room's page as a worker through the room's API: each round it sends a
    pseudo-gradient and reports the eval loss of the version it trained (EVALS), then that of
    the room's last version, with the command's tick between."""
    EVALS = (5.0, 4.0, 3.0)

    def drive(self, url, run, timeout, tick, join_token=None):
        import numpy as np

        from andrea.cli.chromium import drive_result
        from tests.trainer_client import bearer

        room_url = f"{url}/api/runs/{run['id']}/room"
        me = httpx.post(f"{room_url}/workers", headers=bearer(join_token)).json()
        auth = bearer(me["token"])
        numel = httpx.get(room_url).json()["numel"]
        for v in range(len(self.EVALS)):
            assert tick() is None
            if v < len(self.EVALS) - 1:
                r = httpx.post(f"{room_url}/deltas/{v}", headers=auth,
                               content=np.full(numel, 1e-4, "<f4").tobytes())
                assert r.status_code == 200, r.text
            r = httpx.post(f"{room_url}/reports/{v}", headers=auth,
                           json={"losses": [], "eval_loss": self.EVALS[v]})
            assert r.status_code == 204, r.text
        assert tick() is None
        return drive_result(done="finished")


def test_a_room_worker_prints_each_version_and_its_global_eval_loss(server, monkeypatch, capsys):
    """`andrea train --room`: a line per global version (the workers that made it, its global
    eval loss), not a step bar; --json's result has the room's final eval loss."""
    code, result, err = train_in_process(
        monkeypatch, capsys, PageThatTrainsARoom, "--server", server, "--steps", "4",
        "--room", '{"inner_steps": 2, "codec": "f32"}')
    assert code == 0 and result["ok"], result
    assert (result["version"], result["rounds"], result["workers"]) == (2, 2, 1)
    assert (result["final_eval_loss"], result["final_eval_version"]) == (3.0, 2)
    lines = [ln for ln in err.splitlines() if ln.startswith("version ")]
    assert lines == ["version 0/2: the seeded init, global eval loss 5.0000",
                     "version 1/2: 1 worker, global eval loss 4.0000",
                     "version 2/2: 1 worker, global eval loss 3.0000"], err
    assert "step " not in err and "loss -" not in err
    from andrea.cli.train_output import summary
    assert "global eval loss 3.0000 (version 2)" in summary(result)[0]


STOPPED_WHILE_TRAINING = r'''
import sys, time
from andrea.cli import headless, main as cli

class LongRun:
    gpu = False; path = "/usr/bin/chromium"; version = "fake"
    def __init__(self, gpu=False): pass
    def check(self): pass
    def launch(self): pass
    def probe(self): return {"vendor": "fake", "architecture": "", "fallback": True}
    def drive(self, url, run, timeout, tick):
        print("TRAINING", flush=True, file=sys.stderr)
        time.sleep(600)
    def close(self): pass

headless.Chromium = LongRun
sys.exit(cli.main(["train", "--data-dir", sys.argv[1], "--steps", "2", "--json"]))
'''


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_kill_or_a_closed_terminal_stops_the_server_the_command_started(tmp_path, sig):
    """They used to kill the command on the spot: its server, in a session of its own, went on
    holding the data dir, and no JSON was printed."""
    import os
    import signal
    import time

    from andrea.data_dir_lock import holder

    data = tmp_path / "data"
    p = subprocess.Popen([sys.executable, "-c", STOPPED_WHILE_TRAINING, str(data)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server_pid = None
    try:
        for line in p.stderr:
            if "TRAINING" in line:
                break
        server_pid = holder(data)["pid"]
        p.send_signal(getattr(signal, sig))
        out, _ = p.communicate(timeout=HUNG_S)
        assert p.returncode == 130
        assert json.loads(out.strip().splitlines()[-1])["error"] == "interrupted"
        deadline = time.monotonic() + 30
        while holder(data) is not None:
            assert time.monotonic() < deadline, f"the server (pid {server_pid}) outlived it"
            time.sleep(0.1)
    finally:
        if p.poll() is None:
            p.kill()
        if server_pid and holder(data) is not None:
            os.kill(server_pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["cut short", "not a zip"])
def test_an_export_download_cut_short_is_one_line(tmp_path, mode):
    import http.server
    import threading

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"id": "abc"}' if self.path == "/api/runs/abc" else b"oops!"
            self.send_response(200)
            size = 100_000 if mode == "cut short" and body == b"oops!" else len(body)
            self.send_header("content-length", str(size))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = subprocess.run([sys.executable, "-m", "andrea", "export", "abc", "--server",
                            f"http://127.0.0.1:{srv.server_port}", "--out", str(tmp_path / "o")],
                           capture_output=True, text=True)
    finally:
        srv.shutdown()
    assert r.returncode == 1 and r.stderr.startswith("andrea export: "), r.stderr[-1500:]
    assert "Traceback" not in r.stderr
    assert ("closed after" if mode == "cut short" else "not a whole zip") in r.stderr
