"""A throwaway Redis server for the tests that need a broker: Debian's redis-server on a free
loopback port, no persistence, stopped at the end. `bash scripts/test` installs it; where it is
missing the tests that need it are skipped with the command that installs it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time

from andrea.cli.launch import free_port

INSTALL = "apt-get install redis-server"


def redis_binary() -> str | None:
    return shutil.which("redis-server")


@contextlib.contextmanager
def redis_server(port: int | None = None):
    """Yields redis://127.0.0.1:PORT/0 while the server runs (a free port by default)."""
    binary = redis_binary()
    if binary is None:
        raise FileNotFoundError(f"redis-server is not installed ({INSTALL})")
    port = port or free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--daemonize", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
