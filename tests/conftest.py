from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.cli.launch import start_server, stop_server
from andrea.config import Settings
from tests import pg

LOCAL = "http://127.0.0.1"     # TestClient's base_url for a request from this machine's user


class LocalClient(TestClient):
    """A TestClient whose requests come from this machine's user: a loopback peer naming
    127.0.0.1, websockets included (TestClient's own join them to ws://testserver)."""

    def __init__(self, app, **kwargs):
        super().__init__(app, base_url=LOCAL, client=("127.0.0.1", 50000), **kwargs)

    def websocket_connect(self, url: str, *args, **kwargs):
        return super().websocket_connect(urljoin("ws://127.0.0.1", url), *args, **kwargs)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def client(settings) -> TestClient:
    # Host 127.0.0.1: a local request, which may change runs without a token (deps.authorize).
    with LocalClient(create_app(settings)) as c:
        yield c


pg_cluster = pg.pg_cluster          # session fixture: the test run's throwaway PostgreSQL


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """A fresh, empty PostgreSQL database of the test run's own cluster (tests/pg.py), dropped
    after the test; skipped when PostgreSQL is not installed."""
    with pg_cluster.database() as url:
        yield url


@pytest.fixture
def server_with_env(tmp_path, monkeypatch):
    """A fresh `andrea serve` with its settings from the environment (short deadlines)."""
    procs = []

    def start(**env):
        for k, v in env.items():
            monkeypatch.setenv(f"ANDREA_{k.upper()}", str(v))
        proc, url = start_server(tmp_path / "data")
        procs.append(proc)
        return proc, url
    yield start
    for p in procs:
        stop_server(p)
