"""Starting `andrea serve` as a subprocess on a loopback port: used by `andrea train`,
the benchmarks and the tests, so there is one way to start a server and wait for it. A server
still running when its starter's interpreter exits is stopped then (_stop_the_rest)."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# The servers start_server started and stop_server has not stopped yet.
_LIVE: set[subprocess.Popen] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _limit_files(limit: int):
    """For a child process: no file may grow past `limit` bytes, and a write past it fails with
    EFBIG (SIGXFSZ ignored) as on a full disk. The tests' way to fill a disk without one."""
    def apply():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def start_server(data_dir: Path, port: int | None = None, timeout: float = 60.0,
                 warm_data: bool = False, file_limit: int | None = None,
                 env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """Starts the server (its output appended to data_dir/server.log) and waits until /healthz
    answers; raises RuntimeError if it exits or stays silent. file_limit: the largest file it
    may write (a full disk, for tests); env: ANDREA_* settings besides the environment's; args:
    more `andrea serve` options (`--corpus NAME=PATH`, ...)."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    # -P: the working directory is not put on sys.path, so a folder there named `andrea` (a
    # checkout of this repository, say) cannot shadow the installed package.
    cmd = [sys.executable, "-P", "-m", "andrea", "serve", "--port", str(port),
           "--data-dir", str(data_dir), *args]
    with open(data_dir / "server.log", "a") as log:
        # Its own session: a Ctrl-C meant for the caller (andrea train) must not stop the
        # server that the caller still needs to stop the run cleanly.
        proc = subprocess.Popen(cmd + ([] if warm_data else ["--no-warm-data"]),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})},
                                preexec_fn=_limit_files(file_limit) if file_limit else None)
    _LIVE.add(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode} "
                                   f"(see {data_dir / 'server.log'})")
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1):
                    return proc, url
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the server at {url} did not answer within {timeout:.0f} s")
    except BaseException:   # Ctrl-C included: in its own session, nothing else would stop it
        stop_server(proc)
        raise


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _LIVE.discard(proc)     # (not before it is gone: an interrupted wait leaves it to atexit)


@atexit.register
def _stop_the_rest(timeout: float = 10.0) -> None:
    """Stops the servers this interpreter started and did not stop: in their own session, no
    signal meant for the caller reaches them, so a caller that ended without stop_server (a
    test run interrupted again in its teardown, a KeyboardInterrupt past a `finally`) left them
    serving for good. All told at once, then waited for together."""
    live = [p for p in _LIVE if p.poll() is None]
    for proc in live:
        proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _LIVE.clear()


@contextlib.contextmanager
def served(data_dir: Path | None = None, port: int | None = None, args: tuple[str, ...] = (),
           timeout: float = 60.0):
    """A server for the duration of the block (a fresh temporary data dir by default); args:
    more `andrea serve` options."""
    proc, url = start_server(data_dir or Path(tempfile.mkdtemp(prefix="andrea-")), port,
                             timeout=timeout, args=args)
    try:
        yield url
    finally:
        stop_server(proc)
