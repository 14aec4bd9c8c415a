"""The server on a database it cannot write or open: a read-only database answers 503 with the
reason, and start-up names the database it cannot open (the store itself:
tests/service/test_store.py)."""

from __future__ import annotations

import sqlite3

import pytest

from andrea.cli.launch import start_server
from tests.trainer_client import record


def test_a_read_only_database_answers_503_with_the_reason(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings
    from andrea.store import Database

    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings)) as c:
        run = c.post("/api/runs", json={"preset": "tiny"}).json()

        def read_only(self):
            conn = getattr(self._local, "ro", None)
            if conn is None:
                conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
                conn.row_factory = sqlite3.Row
                self._local.ro = conn
            return conn
        monkeypatch.setattr(Database, "sqlite_connection", read_only)
        r = c.post("/api/runs", json={"preset": "tiny"})
        assert r.status_code == 503 and "andrea.sqlite" in r.json()["detail"] and \
            "readonly" in r.json()["detail"], r.text
        with c.websocket_connect(f"/ws/runs/{run['id']}") as ws:
            ws.send_json({"type": "hello", "token": run["token"]})
            ws.receive_json()
            ws.send_json({"type": "metrics", "records": [record(1)]})
            error = ws.receive_json()
            assert error["type"] == "error" and "readonly" in error["message"]


def test_start_up_names_the_database_it_cannot_open(tmp_path):
    data = tmp_path / "data"
    (data / "andrea.sqlite").mkdir(parents=True)          # not a file: cannot be opened
    with pytest.raises(RuntimeError):
        start_server(data, timeout=30)
    log = (data / "server.log").read_text()
    assert str(data / "andrea.sqlite") in log and "StoreUnavailable" in log, log[-2000:]
