from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.config import Settings
from tests import pg
from tests.servers import Servers

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
def servers(tmp_path):
    """servers(data_dir=None, **settings) -> Server: a real `andrea serve` of this test's own
    with these settings (tests/servers.py; by default on a fresh data dir under tmp_path),
    stopped at the test's end. For a test whose settings, data dir or process (its memory, its
    CPU time) are its subject; tests that only make and read runs of their own share the
    session's (tests/browser.py live_server) or their module's."""
    started = Servers(tmp_path)
    try:
        yield started
    finally:
        started.close()
