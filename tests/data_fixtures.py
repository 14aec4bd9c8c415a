"""Shared fixtures for the tests/*/test_data_*.py files (a pytest plugin, see conftest.py).

The tokenizers and token files are the session's cache (ANDREA_CACHE_DIR, conftest.py), the one
every app, server and `andrea train` of the test run reads: the tiny preset's are built once for
the whole run (about 8 s on 2 cores), by whichever test first asks (the others wait for it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.config import Settings
from andrea.data.hub import DataHub

TINY_V = 512


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The data dir (database, weights) of these tests' apps; their corpus caches are the
    session's."""
    return tmp_path_factory.mktemp("andrea-data")


@pytest.fixture(scope="session")
def corpus_cache() -> Path:
    """The session's tokenizers/ and token files/ (what an app's Settings.corpus_dir is here)."""
    return Path(os.environ["ANDREA_CACHE_DIR"])


@pytest.fixture(scope="session")
def hub(corpus_cache) -> DataHub:
    return DataHub(corpus_cache)


@pytest.fixture(scope="session")
def tiny(hub):
    return hub.prepared(TINY_V)


@pytest.fixture
def data_client(data_dir):
    with TestClient(create_app(Settings(data_dir=data_dir))) as c:
        yield c
