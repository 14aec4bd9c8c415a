"""Stopping a test run stops its servers. start_server puts each server in its own session
(a Ctrl-C meant for `andrea train` must not stop the server it still needs), so no signal sent
to the test run reaches them: whatever ends the run without its teardown left them serving for
good. A run started with SIGINT ignored (`bash scripts/test &` from a script: bash ignores it
for background jobs, and `exec` passes that on) ignored the SIGINT and went on; a SIGTERM or a
SIGHUP (the terminal closed) ended it at once, teardown skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
# The child test run (tests/interrupt_child.py: not collected by the suite itself) writes its
# server's pid to the file this names.
CHILD = "ANDREA_TEST_INTERRUPT_CHILD"


def running(pid: int) -> bool:
    """The process exists and is no zombie (an orphan is reaped by whoever adopted it)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def kill_if_running(pid: int | None) -> None:
    if pid is not None and running(pid):
        os.kill(pid, signal.SIGKILL)


def test_a_server_its_caller_did_not_stop_stops_when_the_caller_exits(tmp_path):
    """The caller ends without stop_server (here a KeyboardInterrupt past everything, as a
    second Ctrl-C during a test run's teardown): its server stops with its interpreter."""
    code = (f"from pathlib import Path\nfrom andrea.cli.launch import start_server\n"
            f"proc, url = start_server(Path({str(tmp_path / 'data')!r}))\n"
            f"print(proc.pid, flush=True)\nraise KeyboardInterrupt\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path)
    pid = int(r.stdout.split()[0])
    try:
        assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, r.stderr
        assert gone_within(pid, 5), f"server {pid} outlived the process that started it"
    finally:
        kill_if_running(pid)


def _as_a_background_job() -> None:
    """A script's background job in a terminal: SIGINT ignored, SIGHUP as a terminal leaves it
    (this test run may itself run under nohup, which would pass its SIGHUP ignored on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_to_the_test_run_ends_it_and_its_servers(tmp_path, sig):
    """A test run (started as a script's background job: SIGINT ignored) is sent `sig` to its
    process group, as `kill -INT -PGID`, a kill or a closed terminal does: it ends within
    seconds, and the server its test started ends with it."""
    pid_file = tmp_path / "server.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / "child"), str(ROOT / "tests" / "interrupt_child.py")],
        cwd=ROOT, env={**os.environ, CHILD: str(pid_file)}, start_new_session=True,
        preexec_fn=_as_a_background_job, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    server = None
    try:
        deadline = time.monotonic() + 180
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None, run.stdout.read()
            assert time.monotonic() < deadline, "the child test did not start its server"
            time.sleep(0.1)
        server = int(pid_file.read_text())
        os.killpg(run.pid, getattr(signal, sig))
        try:
            out, _ = run.communicate(timeout=180)     # (a loaded CI machine: minutes)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the test run went on after {sig}")
        assert run.returncode != 0, out
        assert gone_within(server, 5), f"server {server} outlived the test run ({sig}):\n{out}"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        kill_if_running(server)
