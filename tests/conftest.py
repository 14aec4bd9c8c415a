import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.config import Settings
from tests import pg

LOCAL = "http://127.0.0.1"     # TestClient's base_url for a request from this machine's user
LOCAL_PEER = ("127.0.0.1", 50000)   # ... and its connection's address (TestClient's `client`)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def client(settings) -> TestClient:
    # Host 127.0.0.1: a local request, which may change runs without a token (deps.authorize).
    with TestClient(create_app(settings), base_url=LOCAL, client=LOCAL_PEER) as c:
        yield c


pg_cluster = pg.pg_cluster          # session fixture: the test run's throwaway PostgreSQL


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """A fresh, empty PostgreSQL database of the test run's own cluster (tests/pg.py), dropped
    after the test; skipped when PostgreSQL is not installed."""
    with pg_cluster.database() as url:
        yield url
