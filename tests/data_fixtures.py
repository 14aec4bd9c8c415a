"""Shared fixtures for the tests/test_data_*.py files (a pytest plugin, see conftest.py).

One data dir per test session, with the tiny preset's tokenizer and token files built once
(about 2 s on 2 cores); every app and hub in these tests reads the same on-disk cache.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.config import Settings
from andrea.data.hub import DataHub

TINY_V = 512


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "andrea-data-cache"
    DataHub(path).prepared(TINY_V)
    return path


@pytest.fixture(scope="session")
def hub(data_dir) -> DataHub:
    return DataHub(data_dir)


@pytest.fixture(scope="session")
def tiny(hub):
    return hub.prepared(TINY_V)


@pytest.fixture
def data_client(data_dir):
    with TestClient(create_app(Settings(data_dir=data_dir))) as c:
        yield c
