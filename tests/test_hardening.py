"""Hardening against hostile or broken clients, each measured on a real server where it
matters: memory (VmRSS of the uvicorn process) stays flat under silent and slow viewers, no
write without the run's token, every request's work bounded (CPU time of the process), viewers
see only committed values, strict validation, the Host/Origin allow-list, clear errors for a
full disk or an unusable data dir, and bandit batches that survive a restart."""

from __future__ import annotations

import json
import socket
import sqlite3
import struct
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from andrea.cli.launch import start_server, stop_server
from andrea.telemetry import MAX_MESSAGE_BYTES
from tests.trainer_client import (
    cpu_s,
    expect_close,
    fill,
    hello,
    n_fds,
    new_run,
    raw_ws,
    record,
    rss_mib,
    ws_url,
)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A fresh `andrea serve` with its settings from the environment (short deadlines)."""
    procs = []

    def start(**env):
        for k, v in env.items():
            monkeypatch.setenv(f"ANDREA_{k.upper()}", str(v))
        proc, url = start_server(tmp_path / "data")
        procs.append(proc)
        return proc, url
    yield start
    for p in procs:
        stop_server(p)


# ---- 1. memory per viewer is bounded ------------------------------------------------------------


def test_silent_viewers_hold_bounded_memory_and_are_freed(server):
    """20 viewers that never read, on a 50,000-record run. Before: each loaded the whole backlog
    and kept it while its send was blocked (+707 MiB for 20 on 100k records, never freed)."""
    proc, url = server(viewer_send_timeout_s=3, max_viewers_per_client=20)
    run = new_run(url, steps=50_000)
    fill(url, run, 1, 50_000)
    time.sleep(0.5)
    base, fds = rss_mib(proc.pid), n_fds(proc.pid)
    socks = [raw_ws(url, f"/ws/runs/{run['id']}/watch") for _ in range(20)]
    peak = base
    for _ in range(60):
        peak = max(peak, rss_mib(proc.pid))
        time.sleep(0.05)
    assert peak - base < 40, f"20 silent viewers: {base:.0f} -> {peak:.0f} MiB"
    # Their sends stall; past the deadline (3 s) each connection is freed by the server.
    deadline = time.monotonic() + 20
    while n_fds(proc.pid) > fds:
        assert time.monotonic() < deadline, "silent viewers were never freed"
        time.sleep(0.2)
    for s in socks:
        s.close()


class FrameReader:
    """The server's frames off a raw socket (unmasked), read only when asked."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""
        head = self._until(b"\r\n\r\n")
        assert b" 101 " in head.split(b"\r\n")[0], head

    def _until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            self._more()
        head, self.buf = self.buf.split(sep, 1)
        return head

    def _more(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise EOFError
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self) -> tuple[int, bytes]:
        b0, b1 = self._take(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._take(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._take(8))[0]
        return b0 & 0x0F, self._take(n)


def test_a_slow_viewer_is_dropped_with_1013_and_resumes_after_its_last_step(server):
    proc, url = server(viewer_queue_bytes=65536, viewer_send_timeout_s=30)
    run = new_run(url, steps=60_000)
    sock = raw_ws(url, f"/ws/runs/{run['id']}/watch", rcvbuf=2048)
    reader = FrameReader(sock)
    assert json.loads(reader.frame()[1])["type"] == "run"
    time.sleep(0.5)                          # subscribed (the backlog was empty)
    fill(url, run, 1, 60_000, per=500)       # ~9 MB live while the viewer does not read
    steps, error, code = [], None, None
    while True:
        op, data = reader.frame()
        if op == 8:
            code = struct.unpack("!H", data[:2])[0]
            break
        msg = json.loads(data)
        if msg["type"] == "records":
            steps += [r["step"] for r in msg["records"]]
        elif msg["type"] == "error":
            error = msg["message"]
    sock.close()
    assert code == 1013 and error and "too slow" in error and "?after=" in error, (code, error)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 60_000
    # It comes back after its last step and gets exactly the rest.
    with connect(ws_url(url, f"/ws/runs/{run['id']}/watch?after={steps[-1]}")) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "run"
        while steps[-1] < 60_000:
            msg = json.loads(ws.recv(timeout=10))
            steps += [r["step"] for r in msg["records"]]
    assert steps == list(range(1, 60_001))
    assert rss_mib(proc.pid) < 200


def test_viewer_after_and_from_resend_only_later_records(client):
    run = client.post("/api/runs", json={"preset": "tiny", "steps": 2000}).json()
    with client.websocket_connect(f"/ws/runs/{run['id']}") as t:
        t.send_json({"type": "hello", "token": run["token"]})
        t.receive_json()
        t.send_json({"type": "metrics", "records": [record(s) for s in range(1, 1001)]})
        assert t.receive_json()["step"] == 1000
        t.send_json({"type": "sample", "step": 500, "text": "mid"})
        t.send_json({"type": "sample", "step": 900, "text": "late"})
        t.send_json({"type": "ping"})
        t.receive_json()
    with client.websocket_connect(f"/ws/runs/{run['id']}/watch?after=800") as v:
        assert v.receive_json()["type"] == "run"
        got = []
        while len(got) < 200:
            got += [r["step"] for r in v.receive_json()["records"]]
        assert got == list(range(801, 1001))
        assert v.receive_json() == {"type": "sample", "step": 900, "kind": "sample", "text": "late"}
        v.send_json({"type": "from", "step": 990})
        again = v.receive_json()
        assert [r["step"] for r in again["records"]] == list(range(991, 1001))
        v.send_json({"type": "ping"})
        assert v.receive_json()["type"] == "pong"        # no events after 990
    with client.websocket_connect(f"/ws/runs/{run['id']}/watch?after=x") as v:
        assert v.receive_json()["type"] == "error"


@pytest.mark.parametrize("after", ["%C2%B2", "%D9%A1", "-1", "1e3", "12345678901"])
def test_a_viewer_after_that_is_no_ascii_step_closes_1003(client, after):
    """"²" passes str.isdigit() but not int(); "١" (Arabic-Indic one) is no step either."""
    from starlette.websockets import WebSocketDisconnect

    run = client.post("/api/runs", json={"preset": "tiny"}).json()
    with client.websocket_connect(f"/ws/runs/{run['id']}/watch?after={after}") as v:
        error = v.receive_json()
        assert error["type"] == "error" and "after must be a step" in error["message"], error
        with pytest.raises(WebSocketDisconnect) as closed:
            v.receive_json()
        assert closed.value.code == 1003


def test_a_big_viewer_message_closes_1009(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}/watch"), max_size=None) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "run"
        ws.send(json.dumps({"type": "from", "step": 1, "pad": "x" * 100_000}))
        with pytest.raises(ConnectionClosed) as e:
            for _ in range(10):
                ws.recv(timeout=10)
        assert e.value.rcvd.code == 1009
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}/watch")) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "launch"}))
        assert "invalid message" in expect_close(ws, 1003)


# ---- 2. no unauthenticated writes, bounded work -------------------------------------------------


def test_source_losses_need_the_runs_token(client):
    run = client.post("/api/runs", json={"preset": "tiny", "data_mode": "bandit"}).json()
    url = f"/api/runs/{run['id']}/source_losses"
    body = {"step": 1, "losses": {"0": 3.0}}
    assert client.post(url, json=body).status_code == 403
    assert client.post(url, json=body, headers={"authorization": run["token"]}).status_code \
        == 403                                                       # no bare tokens
    assert client.post(url, json=body, headers={"authorization": "Bearer nope"}).status_code \
        == 403
    ok = client.post(url, json=body, headers={"authorization": f"Bearer {run['token']}"})
    assert ok.status_code == 200, ok.text
    far = client.post(url, json={"step": 10**6, "losses": {}},
                      headers={"authorization": f"Bearer {run['token']}"})
    assert far.status_code == 400 and "beyond" in far.text
    # Ad hoc runs: the token comes with their batches.
    first = client.get("/api/batches/0?preset=tiny&seed=3&batch_size=2&mode=bandit")
    adhoc = first.headers["x-andrea-run"]
    url = f"/api/runs/{adhoc}/source_losses"
    assert client.post(url, json=body).status_code == 403
    assert client.post(url, json=body, headers={
        "authorization": f"Bearer {first.headers['x-andrea-token']}"}).status_code == 200
    # Bare tokens are refused for the other writes too.
    r = client.put(f"/api/runs/{run['id']}/weights", content=b"x",
                   headers={"authorization": run["token"]})
    assert r.status_code == 403


def test_requests_do_bounded_work(server):
    """CPU time of the server for requests that used to cost seconds each: a bandit decided
    up to step 1e6, a tokenizer trained for any vocab size (only the sizes a run may have are
    built), a 64 MiB ad hoc batch."""
    proc, url = server()
    run = new_run(url, data_mode="bandit")
    token = {"authorization": f"Bearer {run['token']}"}
    httpx.get(url + "/api/corpus", timeout=60)                     # the corpus read once
    t0 = cpu_s(proc.pid)
    for path, status in [
        ("/api/batches/999999?preset=tiny&mode=bandit&steps=1000000", 400),
        ("/api/batches/0?preset=tiny&batch_size=4096&seq_len=4095", 400),
        ("/api/batches/0?preset=tiny&batch_size=2048", 400),
        ("/api/tokenizer/300", 404), ("/api/tokenizer/3000", 404),
        ("/api/corpus?vocab_size=1000", 400),
    ]:
        r = httpx.get(url + path, timeout=60)
        assert r.status_code == status, (path, r.text)
    r = httpx.post(f"{url}/api/runs/{run['id']}/source_losses", headers=token, timeout=60,
                   json={"step": 999_999, "losses": {"0": 1.0}})
    assert r.status_code == 400
    spent = cpu_s(proc.pid) - t0
    assert spent < 1.0, f"{spent:.2f} s of CPU"


def test_an_ad_hoc_bandit_costs_little_at_its_last_step(data_client):
    t0 = time.process_time()
    r = data_client.get("/api/batches/99999?preset=tiny&seed=9&batch_size=2&mode=bandit")
    assert r.status_code == 200
    assert time.process_time() - t0 < 1.5


# ---- 4. viewers see what is committed -----------------------------------------------------------


def test_viewers_get_only_committed_values(live_server):
    run = new_run(live_server, steps=20)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as t, \
            connect(ws_url(live_server, f"/ws/runs/{run['id']}/watch")) as v:
        hello(t, run["token"])
        assert json.loads(v.recv(timeout=10))["type"] == "run"
        t.send(json.dumps({"type": "metrics", "records": [record(1), record(2)]}))
        assert json.loads(t.recv(timeout=10))["step"] == 2
        assert [r["step"] for r in json.loads(v.recv(timeout=10))["records"]] == [1, 2]
        # Resent with other values: the database keeps the first; viewers get nothing of it.
        t.send(json.dumps({"type": "metrics", "records": [record(2, 99.0), record(3)]}))
        assert json.loads(t.recv(timeout=10))["step"] == 3
        live = json.loads(v.recv(timeout=10))["records"]
        assert [(r["step"], r["loss"]) for r in live] == [(3, 5.0)]
    stored = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics").json()
    assert [r["loss"] for r in stored] == [5.0, 5.0, 5.0]


# ---- 6. strict validation, steps within the run, finished stays finished -------------------------


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


@pytest.mark.parametrize("bad", [{"steps": "100"}, {"steps": True}, {"steps": 100.0},
                                 {"clip": 1}, {"clip_mode": "sometimes"}, {"clip_mode": 1},
                                 {"clip_mode": None}, {"lr": "0.1"}, {"seed": False}])
def test_run_config_is_strict(client, bad):
    assert client.post("/api/runs", json={"preset": "tiny", **bad}).status_code == 422


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


# ---- 6. Host and Origin --------------------------------------------------------------------------


def test_host_and_origin_are_checked_against_the_allow_list(server):
    proc, url = server(allowed_hosts="andrea.lan")
    port = int(url.rsplit(":", 1)[1])
    assert httpx.get(url + "/api/runs", headers={"host": f"evil.example:{port}"}).status_code \
        == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"andrea.lan:{port}"):
        assert httpx.get(url + "/api/runs", headers={"host": host}).status_code == 200, host
    run = new_run(url)
    path = f"/ws/runs/{run['id']}/watch"
    with pytest.raises(InvalidStatus):           # DNS rebinding: the page's own Host
        connect(ws_url(url, path), additional_headers={"host": f"evil.example:{port}"},
                origin=f"http://evil.example:{port}")
    with pytest.raises(InvalidStatus):           # Origin not in the list, even if Host is
        connect(ws_url(url, path), origin=f"http://evil.example:{port}")
    with pytest.raises(InvalidStatus):           # an allowed name on another port
        connect(ws_url(url, path), origin=f"http://localhost:{port + 1}")
    for origin in (f"http://localhost:{port}", f"http://andrea.lan:{port}"):
        with connect(ws_url(url, path), origin=origin) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "run"


# ---- 6. a full disk, an unusable data dir --------------------------------------------------------


def test_a_full_disk_is_told_to_the_trainer_and_the_api(tmp_path):
    data = tmp_path / "data"
    proc, url = start_server(data)
    try:
        run = new_run(url, steps=100_000)
    finally:
        stop_server(proc)
    proc, url = start_server(data, file_limit=1 << 20)        # no file past 1 MiB: the WAL fills up
    try:
        with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
            hello(ws, run["token"])
            with pytest.raises(ConnectionClosed) as e:
                for i in range(1, 100_000, 2000):
                    ws.send(json.dumps({"type": "metrics", "records": [
                        record(s) for s in range(i, i + 2000)]}))
                    msg = json.loads(ws.recv(timeout=30))
                    if msg["type"] == "error":
                        error = msg["message"]
            assert e.value.rcvd.code == 1013
        assert "andrea.sqlite" in error and "kept" in error, error
        # Small writes may still fit in what the failed batch left; once nothing fits, the API
        # says why with a 503 (never a bare 500).
        for _ in range(400):
            r = httpx.post(url + "/api/runs", json={"preset": "tiny"})
            if r.status_code != 201:
                break
        assert r.status_code == 503 and "andrea.sqlite" in r.json()["detail"], r.text
    finally:
        stop_server(proc)


def test_a_read_only_database_answers_503_with_the_reason(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings
    from andrea.store import Store

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
        monkeypatch.setattr(Store, "_conn", read_only)
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


# ---- 5. bandit batches are the same after a restart ----------------------------------------------


def test_bandit_batches_survive_a_server_restart(tmp_path):
    data = tmp_path / "data"
    proc, url = start_server(data)
    try:
        run = new_run(url, steps=300, batch_size=2, data_mode="bandit")
        rid, step, before = run["id"], 0, {}
        with connect(ws_url(url, f"/ws/runs/{rid}")) as ws:
            hello(ws, run["token"])
            for phase in range(5):
                before[step] = httpx.get(f"{url}/api/runs/{rid}/batches/{step}", timeout=60).content
                info = httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"][-1]
                end = info["start"] + info["length"]
                ws.send(json.dumps({"type": "metrics", "records": [
                    {**record(s + 1), "source_losses": {"0": 6.0 - 0.5 * phase, "1": 6.0}}
                    for s in range(step, end)]}))
                assert json.loads(ws.recv(timeout=10))["type"] == "ack"
                step = end
        before[step] = httpx.get(f"{url}/api/runs/{rid}/batches/{step}", timeout=60).content
        phases = httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"]
    finally:
        stop_server(proc)
    proc, url = start_server(data)
    try:
        # Asked in another order than before: the same bytes.
        for s in sorted(before, reverse=True):
            got = httpx.get(f"{url}/api/runs/{rid}/batches/{s}", timeout=60).content
            assert got == before[s], s
        assert httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"] == phases
    finally:
        stop_server(proc)
