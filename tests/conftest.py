import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.config import Settings
from tests import pg


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def client(settings) -> TestClient:
    with TestClient(create_app(settings)) as c:
        yield c


pg_cluster = pg.pg_cluster          # session fixture: the test run's throwaway PostgreSQL


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """A fresh, empty PostgreSQL database of the test run's own cluster (tests/pg.py), dropped
    after the test; skipped when PostgreSQL is not installed."""
    with pg_cluster.database() as url:
        yield url
