"""The websocket protocol against a real uvicorn server with a real websocket client."""

import json
import math
import sqlite3

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.telemetry import MAX_MESSAGE_BYTES, MAX_RECORDS, RECORDS_PER_MESSAGE


def ws_url(live_server, path):
    return live_server.replace("http://", "ws://") + path


def new_run(live_server, **cfg):
    r = httpx.post(live_server + "/api/runs", json={"preset": "tiny", **cfg})
    assert r.status_code == 201, r.text
    return r.json()


def record(step, loss=None):
    return {"step": step, "loss": 5.0 - step * 0.01 if loss is None else loss,
            "grad_norm": 1.5, "clip_scale": 0.66, "lr": 1e-3, "tokens_per_s": 100.0,
            "step_ms": 12.0}


def hello(ws, token, last=None):
    ws.send(json.dumps({"type": "hello", "token": token, "last_acked_step": last}))
    return json.loads(ws.recv(timeout=10))


def send_metrics(ws, records):
    ws.send(json.dumps({"type": "metrics", "records": records}))
    return json.loads(ws.recv(timeout=10))


def metrics(live_server, run_id):
    return httpx.get(f"{live_server}/api/runs/{run_id}/metrics").json()


def test_reconnect_and_resend_lose_nothing_and_duplicate_nothing(live_server, server_data_dir):
    run = new_run(live_server)
    url = ws_url(live_server, f"/ws/runs/{run['id']}")
    with connect(url) as ws:
        assert hello(ws, run["token"]) == {"type": "welcome", "last_committed_step": None,
                                           "records_per_message": RECORDS_PER_MESSAGE,
                                           "max_message_bytes": MAX_MESSAGE_BYTES}
        assert send_metrics(ws, [record(s) for s in range(1, 6)]) == {"type": "ack", "step": 5}
        ws.send(json.dumps({"type": "metrics", "records": [record(s) for s in range(6, 9)]}))
        # Drop the connection before reading the ack: the client cannot know 6..8 landed.
    with connect(url) as ws:
        welcome = hello(ws, run["token"], last=5)
        assert welcome["last_committed_step"] == 8
        # A client that resends everything after its last ack changes nothing...
        assert send_metrics(ws, [record(s, loss=99.0) for s in range(6, 9)])["step"] == 8
        assert send_metrics(ws, [record(s) for s in range(9, 11)])["step"] == 10
    rows = metrics(live_server, run["id"])
    assert [r["step"] for r in rows] == list(range(1, 11))          # each step exactly once
    assert all(r["loss"] != 99.0 for r in rows)                        # first write wins
    # ...and the SQLite file on disk holds the same.
    db = sqlite3.connect(server_data_dir / "andrea.sqlite")
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT step) FROM metrics WHERE run_id = ?",
                      (run["id"],)).fetchone() == (10, 10)


def test_viewer_gets_backlog_then_live_records(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as trainer:
        hello(trainer, run["token"])
        send_metrics(trainer, [record(1), record(2)])
        with connect(ws_url(live_server, f"/ws/runs/{run['id']}/watch")) as viewer:
            assert json.loads(viewer.recv(timeout=10))["type"] == "run"
            backlog = json.loads(viewer.recv(timeout=10))
            assert [r["step"] for r in backlog["records"]] == [1, 2]
            send_metrics(trainer, [record(3)])
            live = json.loads(viewer.recv(timeout=10))
            assert live["type"] == "records" and [r["step"] for r in live["records"]] == [3]
            trainer.send(json.dumps({"type": "status", "status": "finished"}))
            assert json.loads(viewer.recv(timeout=10))["run"]["status"] == "finished"


def test_non_finite_loss_is_stored_as_null(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        r = record(1)
        r["loss"] = None
        r["grad_norm"] = None
        assert send_metrics(ws, [r])["step"] == 1
    assert metrics(live_server, run["id"])[0]["loss"] is None


def expect_close(ws, code):
    with pytest.raises(ConnectionClosed) as e:
        for _ in range(5):
            msg = json.loads(ws.recv(timeout=10))
            assert msg["type"] == "error" and msg["message"]
    assert e.value.rcvd.code == code, e.value


BAD = {
    "not-json": ("not json", 1003),
    "missing-fields": (json.dumps({"type": "metrics", "records": [{"step": 1}]}), 1003),
    "wrong-type": (json.dumps({"type": "metrics", "records": [{**record(1), "step": "one"}]}),
                   1003),
    "extra-field": (json.dumps({"type": "metrics", "records": [{**record(1), "x": 1}]}), 1003),
    "nan": ('{"type": "metrics", "records": [{"step": 1, "loss": NaN, "grad_norm": 1,'
            ' "clip_scale": 1, "lr": 0.1}]}', 1003),
    "too-many-records": (json.dumps({"type": "metrics",
                                     "records": [record(1)] * (MAX_RECORDS + 1)}), 1003),
    "huge": (json.dumps({"type": "metrics", "records": [record(1)] * 9000}), 1009),
    "unknown-type": (json.dumps({"type": "launch"}), 1003),
    "negative-time": (json.dumps({"type": "metrics", "records": [{**record(1), "opt_ms": -1}]}),
                      1003),
    # row_losses: one mean loss per row of the run's batch (tiny's default: 8 rows).
    "row-losses-wrong-length": (json.dumps({"type": "metrics", "records": [
        record(2), {**record(3), "row_losses": [4.5] * 3}]}), 1003),
    "row-losses-negative": (json.dumps({"type": "metrics", "records": [
        {**record(2), "row_losses": [4.5] * 7 + [-0.5]}]}), 1003),
    "row-losses-not-numbers": (json.dumps({"type": "metrics", "records": [
        {**record(2), "row_losses": "4.5"}]}), 1003),
    "row-losses-too-long": (json.dumps({"type": "metrics", "records": [
        {**record(2), "row_losses": [4.5] * 1025}]}), 1003),
}


def test_row_losses_are_stored_served_and_kept_with_non_finite_rows(live_server):
    run = new_run(live_server, batch_size=4)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        rows = [4.5, 6.25, None, 3.0]   # a row whose loss was not finite is None
        assert send_metrics(ws, [{**record(1), "row_losses": rows}, record(2)]) == \
            {"type": "ack", "step": 2}
    got = metrics(live_server, run["id"])
    assert got[0]["row_losses"] == rows and "row_losses" not in got[1]


@pytest.mark.parametrize("payload,code", list(BAD.values()), ids=list(BAD))
def test_bad_messages_close_with_a_clear_error(live_server, payload, code):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}"), max_size=None) as ws:
        hello(ws, run["token"])
        send_metrics(ws, [record(1)])
        ws.send(payload)
        expect_close(ws, code)
    # Committed data survives the bad message.
    assert [r["step"] for r in metrics(live_server, run["id"])] == [1]


def test_wrong_token_unknown_run_and_origin_are_refused(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        ws.send(json.dumps({"type": "hello", "token": "guess"}))
        expect_close(ws, 1008)
    with connect(ws_url(live_server, "/ws/runs/nope")) as ws:
        ws.send(json.dumps({"type": "hello", "token": "x"}))
        expect_close(ws, 1008)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        ws.send(json.dumps({"type": "ping"}))   # hello must come first
        expect_close(ws, 1008)
    with pytest.raises(Exception):
        with connect(ws_url(live_server, f"/ws/runs/{run['id']}"),
                     origin="http://evil.example") as ws:
            ws.recv(timeout=10)


def test_metrics_csv_export(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        send_metrics(ws, [record(1), record(2)])
    csv = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics?format=csv").text.splitlines()
    assert csv[0].startswith("step,loss,grad_norm,clip_scale,lr")
    assert len(csv) == 3 and math.isclose(float(csv[1].split(",")[1]), 4.99)
