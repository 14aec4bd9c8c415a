"""The trainer socket (telemetry/trainer.py, protocol.py) is strict: records, hellos and
samples within the run, the message limit counted in bytes, and a finished run stays
finished."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from andrea.telemetry import MAX_MESSAGE_BYTES
from tests.trainer_client import (
    expect_close,
    hello,
    new_run,
    record,
    ws_url,
)

# ---- strict validation, steps within the run, finished stays finished ----------------------------


@pytest.mark.parametrize("bad", [
    {"step": True}, {"step": "5"}, {"step": 5.0}, {"step": 21}, {"step": 10**9},
    {"loss": "5"}, {"lr": True}, {"phase": "1"},
])
def test_records_are_strict_and_within_the_run(live_server, bad):
    run = new_run(live_server, steps=20)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        ws.send(json.dumps({"type": "metrics", "records": [{**record(1), **bad}]}))
        expect_close(ws, 1003)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        assert hello(ws, run["token"])["last_committed_step"] is None   # nothing stored


def test_hello_and_samples_stay_within_the_run(live_server):
    run = new_run(live_server, steps=20)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"], "last_acked_step": 10**9}))
        assert "beyond" in expect_close(ws, 1003)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        ws.send(json.dumps({"type": "sample", "step": 21, "text": "x"}))
        assert "beyond" in expect_close(ws, 1003)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        ws.send(json.dumps({"type": "status", "status": "running",
                            "adapter": {f"k{i}": i for i in range(33)}}))
        expect_close(ws, 1003)


def test_the_message_limit_counts_bytes(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}"), max_size=None) as ws:
        hello(ws, run["token"])
        # Fewer characters than the limit, more bytes (é is two).
        pad = "é" * (MAX_MESSAGE_BYTES // 2 + 1000)
        ws.send(json.dumps({"type": "ping", "pad": pad}, ensure_ascii=False))
        assert "bytes" in expect_close(ws, 1009)

def test_a_finished_run_stays_finished(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        ws.send(json.dumps({"type": "status", "status": "finished"}))
        ws.send(json.dumps({"type": "status", "status": "running"}))
        assert "resume" in expect_close(ws, 1008)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        ws.send(json.dumps({"type": "status", "status": "failed", "message": "x"}))
        expect_close(ws, 1008)
    assert httpx.get(f"{live_server}/api/runs/{run['id']}").json()["status"] == "finished"
