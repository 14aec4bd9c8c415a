"""A test's own training tab and viewers against a live server: runs made over HTTP, step
records sent over a trainer socket (websockets' sync client) the way the page does, each batch
acknowledged before the next, a socket's close read to its code, a websocket that never reads;
and what the tests measure of the server's process (psutil: memory, CPU time, open files)."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from contextlib import contextmanager

import httpx
import numpy as np
import psutil
import pytest
from sqlalchemy import text
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.run_config import RunConfig, StoredRunConfig
from andrea.telemetry import MAX_RECORDS
from andrea.telemetry.protocol import BUSY


def send_records(ws, first: int, last: int, per: int, record, pause: float, on_ack) -> None:
    """Records `first`..`last` (record(step) makes one) in batches of `per` over a socket that
    has said hello; `on_ack(step)` hears each acknowledged step; `pause` s between batches."""
    step = first
    while step <= last:
        batch = [record(s) for s in range(step, min(step + per, last + 1))]
        ws.send(json.dumps({"type": "metrics", "records": batch}))
        ack = json.loads(ws.recv(timeout=10))
        assert ack["type"] == "ack", ack
        on_ack(ack["step"])
        step = batch[-1]["step"] + 1
        time.sleep(pause)


# A server process's footprint, through psutil (the tests' and the benches' one reading of it).
def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def cpu_s(pid: int) -> float:
    """User and system CPU seconds the process has used."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def n_fds(pid: int) -> int:
    return psutil.Process(pid).num_fds()


def record(step: int, loss: float = 5.0) -> dict:
    return {"step": step, "loss": loss, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
            "tokens_per_s": 100.0, "step_ms": 12.0}


def ws_url(url: str, path: str) -> str:
    return url.replace("http://", "ws://") + path


def bearer(token: str) -> dict:
    """The headers of a request that shows `token` (a run's, a room worker's, the operator's)."""
    return {"authorization": f"Bearer {token}"}


def new_run(server, **cfg) -> dict:
    """The tests' one run factory: POST /api/runs with `cfg` over the tiny preset, on `server`
    (a live server's URL, or a client whose base URL is the app's: a TestClient, an
    httpx.Client), asserting it was made; -> the new run (id, token, config, layout)."""
    body = {"preset": "tiny", **cfg}
    r = (httpx.post(server + "/api/runs", json=body, timeout=120) if isinstance(server, str)
         else server.post("/api/runs", json=body))
    assert r.status_code == 201, r.text
    return r.json()


def room_beside_the_api(server: str, rounds: int, seed: int, **room) -> dict:
    """A small room (f32 unless `room` says) of 4 inner steps a round that a page joins beside
    one worker this test plays through the API: {run, url (the room's), api (its join), delta
    (the API worker's pseudo-gradient each round: 1e-4 on every parameter, in the room's
    codec)}."""
    from andrea.room import codec
    from andrea.room.rounds import param_mask
    from tests.small_model import SMALL

    H = 4
    run = httpx.post(f"{server}/api/runs", json={
        **SMALL, "steps": rounds * H, "batch_size": 2, "seed": seed,
        "room": {"inner_steps": H, "codec": "f32", "round_deadline_s": 3600,
                 "workers_per_address": 2, **room}}).json()
    url = f"{server}/api/runs/{run['id']}/room"
    api = httpx.post(f"{url}/workers", headers=bearer(run["room"]["join_token"])).json()
    mask = param_mask(run["layout"])
    delta = codec.encode(np.full(run["layout"]["total_numel"], 1e-4, np.float32) * mask,
                         run["config"]["room"]["codec"])
    return {"run": run, "url": url, "api": api, "delta": delta}


def stored_steps(url: str, run_id: str) -> list[int]:
    """The steps of the records a live server holds of the run."""
    return [r["step"] for r in httpx.get(f"{url}/api/runs/{run_id}/metrics", timeout=60).json()]


def stored_config(corpus_hash: str = "", **cfg) -> StoredRunConfig:
    """The tests' one stored config made without a server: RunConfig's with `cfg` over the tiny
    preset, every default filled in, and `corpus_hash` (what a store's run row holds)."""
    return StoredRunConfig.of(RunConfig(**{"preset": "tiny", **cfg}), corpus_hash)


def store_old_config(store, run_id: str, config: dict, token_sha256: str = "h") -> None:
    """A run whose row holds `config`, a JSON object as an older server stored it (a `clip`
    switch, no shape fields): made with the store's own create, its config column then
    rewritten."""
    store.runs.create(run_id, stored_config(), token_sha256)
    with store.db.tx(write=True) as conn:
        conn.execute(text("UPDATE runs SET config = :config WHERE id = :id"),
                     {"config": json.dumps(config), "id": run_id})


def hello(ws, token: str, last=None) -> dict:
    ws.send(json.dumps({"type": "hello", "token": token, "last_acked_step": last}))
    return json.loads(ws.recv(timeout=15))


@contextmanager
def reconnected(url: str, token: str, last=None):
    """(socket, its hello's answer) of a trainer back after it dropped its socket, as the page
    comes back: while the server has not yet seen the old socket go (refused with kind busy,
    "another trainer holds this run"), it tries again, for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        with connect(url) as ws:
            answer = hello(ws, token, last)
            if answer.get("kind") != BUSY or time.monotonic() > deadline:
                yield ws, answer
                return
        time.sleep(0.05)


def fill(url: str, run: dict, first: int, last: int, per: int = MAX_RECORDS) -> None:
    with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
        assert hello(ws, run["token"])["type"] == "welcome"
        for i in range(first, last + 1, per):
            ws.send(json.dumps({"type": "metrics", "records": [
                record(s) for s in range(i, min(i + per, last + 1))]}))
            assert json.loads(ws.recv(timeout=30))["type"] == "ack"


def expect_close(ws, code: int, or_reason: bool = False) -> str:
    """Reads to the close; every message before it is an error message. Returns its text.
    or_reason: the close frame's reason (the same text, cut to 120 characters) stands in where
    no error message came first: a flooder that never read its socket may have left the
    server's error message unsent when it was cut off (protocol.close)."""
    messages = []
    with pytest.raises(ConnectionClosed) as e:
        for _ in range(1000):
            msg = json.loads(ws.recv(timeout=15))
            if msg["type"] == "error":
                messages.append(msg["message"])
    assert e.value.rcvd is not None and e.value.rcvd.code == code, (e.value, messages)
    if or_reason and not messages:
        return e.value.rcvd.reason
    assert messages, "no error message before the close"
    return messages[-1]


def raw_ws(url: str, path: str, rcvbuf: int = 4096, host: str | None = None) -> socket.socket:
    """A websocket that never reads (its receive buffer tiny): the handshake, then silence."""
    h, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((h, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host or f'{h}:{port}'}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    return s
