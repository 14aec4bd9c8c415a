"""The viewer socket (telemetry/viewer.py) against hostile or broken viewers, on a real server
where it matters: memory (VmRSS of the uvicorn process) stays flat under silent and slow
viewers, a slow one is dropped and resumes after its last step, `after`/`from` resend only later
records and a malformed one closes 1003, a big message closes 1009, and viewers see only
committed values."""

from __future__ import annotations

import json
import socket
import struct
import time
from contextlib import contextmanager

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.trainer_client import (
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

# ---- memory per viewer is bounded ----------------------------------------------------------------


def test_silent_viewers_hold_bounded_memory_and_are_freed(servers):
    """20 viewers that never read, on a 50,000-record run. Before: each loaded the whole backlog
    and kept it while its send was blocked (+707 MiB for 20 on 100k records, never freed)."""
    proc, url, _ = servers(viewer_send_timeout_s=3, max_viewers_per_client=20)
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


def test_a_slow_viewer_is_dropped_with_1013_and_resumes_after_its_last_step(servers):
    proc, url, _ = servers(viewer_queue_bytes=65536, viewer_send_timeout_s=30)
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


@contextmanager
def trainer_at_1000(client, run: dict):
    """The run's trainer socket (an app's TestClient) with records 1..1000 acknowledged."""
    with client.websocket_connect(f"/ws/runs/{run['id']}") as t:
        t.send_json({"type": "hello", "token": run["token"]})
        t.receive_json()
        t.send_json({"type": "metrics", "records": [record(s) for s in range(1, 1001)]})
        assert t.receive_json()["step"] == 1000
        yield t


def test_viewer_after_and_from_resend_only_later_records(client):
    run = new_run(client, steps=2000)
    with trainer_at_1000(client, run) as t:
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
        while "records" not in again:        # (a status line the server sent meanwhile)
            assert again["type"] != "error", again
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

    run = new_run(client)
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

# ---- viewers see what is committed ---------------------------------------------------------------


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


def test_a_status_change_while_a_viewer_subscribes_reaches_it(client, monkeypatch):
    """A change published after a viewer's first "run" message and before its subscription
    reached no queue: the viewer is told the run as it is once subscribed."""
    from andrea.telemetry import viewer

    run = new_run(client, steps=20)
    subscribe = viewer._ViewerSession.start_from

    async def changed_first(self, after):      # the change lands in that window, unpublished
        await self.store.run(self.store.runs.set_status, self.run_id, "running")
        await subscribe(self, after)

    monkeypatch.setattr(viewer._ViewerSession, "start_from", changed_first)
    with client.websocket_connect(f"/ws/runs/{run['id']}/watch") as v:
        assert v.receive_json()["run"]["status"] == "created"
        assert v.receive_json()["run"]["status"] == "running"


def test_a_resume_while_a_viewer_reads_its_backlog_reaches_it(client, monkeypatch):
    """Resumed while a viewer's backlog pages are being read, before it joined the live queue:
    the resume's live message reached no queue, and the viewer kept the replaced records and
    was never sent the new ones. It is told the resume as a live one and gets them."""
    from andrea.runs.info import RESUMABLE
    from andrea.telemetry import viewer

    run = new_run(client, steps=2000)
    with trainer_at_1000(client, run) as t:
        t.send_json({"type": "status", "status": "paused"})
        t.send_json({"type": "ping"})
        t.receive_json()
    store, pace = client.app.state.store, viewer._ViewerSession.pace
    resumed = []

    async def resumed_after_the_first_page(self, n):
        if not resumed:     # another tab resumes from step 2 and trains 3..10 again
            resumed.append(await self.store.run(store.runs.resume, run["id"], 2, "0" * 64,
                                                RESUMABLE))
            await self.store.run(store.metrics.add, run["id"],
                                 [{**record(s), "loss": 1.0} for s in range(3, 11)])
        await pace(self, n)

    monkeypatch.setattr(viewer._ViewerSession, "pace", resumed_after_the_first_page)
    with client.websocket_connect(f"/ws/runs/{run['id']}/watch") as v:
        assert v.receive_json()["type"] == "run"
        seen = []
        while not seen or seen[-1].get("kind") != "resumed":   # the stored event comes last
            seen.append(v.receive_json())
    assert resumed == [None]
    assert {"type": "resumed", "step": 2} in seen, [(m["type"], m.get("step")) for m in seen]
    after = seen[seen.index({"type": "resumed", "step": 2}) + 1:]
    assert [(r["step"], r["loss"]) for m in after if m["type"] == "records"
            for r in m["records"]] == [(s, 1.0) for s in range(3, 11)]
