"""Real `andrea serve` processes for the tests, started one way: `serve(data_dir, **settings)`
for a block (a module's or the session's fixture), `Servers` for the servers a test starts
itself (the `servers` fixture of tests/conftest.py). Starting one, waiting until it answers and
stopping it is andrea.cli.launch's (start_server, stop_server); this module adds the settings,
named as Settings' fields, and the handle the tests use."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from andrea.cli.launch import start_server, stop_server


class Server(NamedTuple):
    """A running `andrea serve`: its process, base URL (http://127.0.0.1:PORT) and data dir."""
    proc: subprocess.Popen
    url: str
    data: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        """Stops it now (again: nothing), e.g. to start another on its data dir."""
        stop_server(self.proc)


def settings_env(**settings) -> dict[str, str]:
    """ANDREA_<NAME> variables for Settings' fields: {"run_burst": 3} -> ANDREA_RUN_BURST=3."""
    return {f"ANDREA_{k.upper()}": str(v) for k, v in settings.items()}


def start(data_dir: Path, *, env: dict[str, str] | None = None, file_limit: int | None = None,
          port: int | None = None, **settings) -> Server:
    """A server on `data_dir`, answering: `settings` as ANDREA_* variables, `env` more
    variables of its environment (PYTHONPATH, ...), `file_limit` the largest file it may write
    (a full disk). Stop it with .stop()."""
    proc, url = start_server(data_dir, port=port, file_limit=file_limit,
                             env={**(env or {}), **settings_env(**settings)})
    return Server(proc, url, data_dir)


@contextmanager
def serve(data_dir: Path, **kwargs) -> Iterator[Server]:
    """A server (start's arguments) for the duration of the block."""
    server = start(data_dir, **kwargs)
    try:
        yield server
    finally:
        server.stop()


class Servers:
    """The servers of one test: `servers(data_dir=None, **kwargs)` starts one (start's
    arguments; by default on a fresh data dir under `root`), and every one it started is
    stopped at the end (close)."""

    def __init__(self, root: Path):
        self.root = root
        self.started: list[Server] = []

    def __call__(self, data_dir: Path | None = None, **kwargs) -> Server:
        server = start(data_dir or self.root / f"data{len(self.started)}", **kwargs)
        self.started.append(server)
        return server

    def close(self) -> None:
        for server in self.started:
            server.stop()
