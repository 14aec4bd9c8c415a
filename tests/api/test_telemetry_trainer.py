"""The trainer socket (telemetry/trainer.py, protocol.py) is strict: records, hellos and
samples within the run, the message limit counted in bytes, and a finished run stays
finished; pings (messages and websocket ping frames) and what comes before the hello count
against the byte rates, and a ping frame flood is closed."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.telemetry import MAX_MESSAGE_BYTES
from andrea.telemetry.protocol import PING_FLOOD
from andrea.telemetry.trainer import HELLO_COST, PING_COST
from andrea.web.quotas import BYTES_BURST_S, MessageRates
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


# ---- pings and what comes before the hello: in the byte rates; a ping frame flood closed -------


def ping_flood(ws, n: int) -> list:
    """Sends up to n ping frames back to back (fewer where the server closes first); their
    pongs' events (set when answered)."""
    pongs = []
    with contextlib.suppress(ConnectionClosed):
        for _ in range(n):
            pongs.append(ws.ping())
    return pongs


def test_a_ping_frame_flood_before_hello_is_closed_and_the_runs_trainer_keeps_working(
        live_server):
    """Before: the websocket layer answered ping frames however fast they came, before a hello
    too, and the app never saw them (1000 pings: 1000 pongs, the socket open until its hello
    timeout). Now each costs PING_COST against its address and a socket past PING_FRAMES is
    closed 1008 (kind ping_flood); the run's own trainer, from another address, naming the
    same run, goes on: acks, pongs, its own ping frames answered."""
    run = new_run(live_server, steps=20)
    url = ws_url(live_server, f"/ws/runs/{run['id']}")
    with connect(url, ping_interval=None) as trainer:
        assert hello(trainer, run["token"])["type"] == "welcome"
        with connect(url, additional_headers={"X-Forwarded-For": "10.61.0.1"},
                     ping_interval=None) as flood:
            pongs = ping_flood(flood, 1000)
            assert "ping flood" in expect_close(flood, 1008, or_reason=True)
        answered = sum(p.is_set() for p in pongs)
        assert answered < 100, answered          # PING_FRAMES: 20 at once, then 2 a second
        assert flood.protocol.close_rcvd.reason.startswith("ping flood")
        for step in (1, 2, 3):
            assert trainer.ping().wait(10)       # a keepalive's ping frames: answered
            trainer.send(json.dumps({"type": "metrics", "records": [record(step)]}))
            assert json.loads(trainer.recv(timeout=10)) == {"type": "ack", "step": step}
            trainer.send(json.dumps({"type": "ping"}))
            assert json.loads(trainer.recv(timeout=10)) == {"type": "pong"}


def test_a_trainers_own_ping_frame_flood_is_closed_with_its_kind(live_server):
    run = new_run(live_server, steps=20)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}"), ping_interval=None,
                 additional_headers={"X-Forwarded-For": "10.61.0.2"}) as ws:
        assert hello(ws, run["token"])["type"] == "welcome"
        ping_flood(ws, 1000)
        with pytest.raises(ConnectionClosed) as e:
            msg = json.loads(ws.recv(timeout=15))
            assert msg["type"] == "error" and msg["kind"] == PING_FLOOD, msg
            ws.recv(timeout=15)
    assert e.value.rcvd is not None and e.value.rcvd.code == 1008


def test_pings_and_what_comes_before_the_hello_count_against_the_byte_rates(client):
    """Before: a ping message cost 256 B (4096 a second before any pacing) and what a socket
    sent before its hello nothing. Now a ping costs PING_COST and the first message HELLO_COST,
    that one from the address' bucket alone (the run named is not charged: anyone may name
    it). A client pinging every few seconds is never paced; a flood is read more slowly
    (counted, with a clock that stands still: no bucket refills)."""
    now = [0.0]
    burst = BYTES_BURST_S * (1 << 20)
    rates = client.app.state.message_rates = MessageRates(1 << 20, 1 << 20,
                                                          clock=lambda: now[0])
    made = client.post("/api/runs", json={"preset": "tiny", "steps": 20}).json()
    path = f"/ws/runs/{made['id']}"
    with client.websocket_connect(path) as ws:
        ws.send_json({"type": "ping"})                      # not a hello: refused, but counted
        assert "must be hello" in ws.receive_json()["message"]
    assert rates.clients.bucket("127.0.0.1").tokens == burst - HELLO_COST
    assert made["id"] not in rates.runs.buckets
    with client.websocket_connect(path) as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"
        for _ in range(300):                                # one every 3 s: never paced
            now[0] += 3.0
            ws.send_json({"type": "ping"})
            assert ws.receive_json() == {"type": "pong"}
        assert rates.paced == 0
        now[0] += 3.0                                       # (the buckets full again)
        for _ in range(burst // PING_COST + 4):             # a flood: the burst, then paced
            ws.send_json({"type": "ping"})
            assert ws.receive_json() == {"type": "pong"}
        assert rates.paced == 4
