"""Bounded bodies and connection times (server/web/limits.py, web/uvicorn_limits.py), each
attack against a real `andrea serve` with small limits (ANDREA_MAX_BODY_BYTES=4096, header and
idle timeouts of 1 s, 8 connections per client address). Before: JSON bodies were read whole (4
x 200 MiB: 2.5-3.4 GB RSS), trickled headers held their connections for ever, one client could
hold every socket. Each test asserts the clear answer and that nothing changed; deadlines only
bound the waits."""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import httpx
import pytest

from andrea.paths import run_dir
from andrea.run_config import StoredRunConfig, run_layout
from tests import trainer_client
from tests.api.test_checkpoints import digests, folder, headers, state
from tests.servers import serve
from tests.trainer_client import n_fds, rss_mib

LIMIT = 4096
PER_CLIENT = 8
LIMITS = {"max_body_bytes": LIMIT, "header_timeout_s": 1, "idle_timeout_s": 1,
          "max_connections_per_client": PER_CLIENT}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("limits") / "data", **LIMITS) as s:
        yield s


def connect(url: str, source: str = "127.0.0.1", rcvbuf: int | None = None) -> socket.socket:
    """A raw connection from `source` (any 127.x.y.z is this machine: another client address)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((source, 0))
    s.connect((host, int(port)))
    return s


def read_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything until the server closes (a reset counts as closed)."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(1 << 16):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def answer(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def new_run(url: str, **cfg) -> dict:
    return trainer_client.new_run(url, **{"steps": 50, **cfg})


def run_ids(url: str) -> set[str]:
    return {r["id"] for r in httpx.get(url + "/api/runs").json()}


def head(method: str, path: str, token: str | None = None, **fields) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Authorization: Bearer {token}"] if token else []
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in fields.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def a_run_to_write(url: str, method: str):
    """A new run, its name and the runs there now (what a refused body must leave as they
    are), and the path `method` writes: POST makes a run, PATCH renames this one."""
    run = new_run(url)
    name, before = httpx.get(f"{url}/api/runs/{run['id']}").json()["name"], run_ids(url)
    return run, name, before, "/api/runs" if method == "POST" else f"/api/runs/{run['id']}"


# ---- 1. bodies are refused before they are read --------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_an_announced_200_mib_body_gets_413_unread(served, method):
    url = served[1]
    run, name, before, path = a_run_to_write(url, method)
    s = connect(url)
    s.sendall(head(method, path, run["token"], content_length=200 << 20)
              + b'{"name": "' + b"x" * 1000)
    status, body = answer(read_all(s))
    assert status == 413
    assert "4096 bytes (ANDREA_MAX_BODY_BYTES" in body["detail"] and "not read" in body["detail"]
    assert run_ids(url) == before
    assert httpx.get(f"{url}/api/runs/{run['id']}").json()["name"] == name


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_chunked_body_past_the_limit_gets_413_and_the_connection_closes(served, method):
    url = served[1]
    run, name, before, path = a_run_to_write(url, method)
    s = connect(url)
    s.sendall(head(method, path, run["token"], transfer_encoding="chunked")
              + b"".join(chunk(b" " * 1024) for _ in range(LIMIT // 1024 + 2)))
    raw = read_all(s)                   # returns only once the server has closed
    status, body = answer(raw)
    assert status == 413 and "passed this server's limit of 4096 bytes" in body["detail"]
    assert run_ids(url) == before
    assert httpx.get(f"{url}/api/runs/{run['id']}").json()["name"] == name


def test_a_body_within_the_limit_still_works(served):
    proc, url, _ = served
    run = new_run(url)
    r = httpx.patch(f"{url}/api/runs/{run['id']}", json={"name": "kept"},
                    headers={"authorization": f"Bearer {run['token']}"})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{url}/api/runs/{run['id']}").json()["name"] == "kept"


def test_four_200_mib_bodies_leave_the_servers_memory_flat(served):
    """Four clients push 200 MiB each, announced or chunked: the server reads 4 KiB of each."""
    proc, url, _ = served
    before_runs, before_rss = run_ids(url), rss_mib(proc.pid)
    sent = []

    def push(chunked: bool):
        s = connect(url)
        fields = {"transfer_encoding": "chunked"} if chunked else {"content_length": 200 << 20}
        total = 0
        try:
            s.sendall(head("POST", "/api/runs", **fields))
            piece = chunk(b" " * (1 << 20)) if chunked else b" " * (1 << 20)
            while total < 200 << 20:
                s.sendall(piece)
                total += 1 << 20
        except OSError:         # the server answered 413 and closed
            pass
        sent.append(total)
        s.close()

    threads = [threading.Thread(target=push, args=(i % 2 == 1,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(sent) == 4 and max(sent) < 200 << 20      # every one was cut off early
    assert rss_mib(proc.pid) - before_rss < 50          # vs. 800 MiB of bodies
    assert run_ids(url) == before_runs
    assert httpx.get(url + "/healthz").status_code == 200


# ---- 2. a head that trickles in is closed -------------------------------------------------------


def test_trickled_heads_are_closed_after_the_header_timeout(served):
    proc, url, _ = served
    # 16 slow heads from 4 client addresses (4 each: within the per-client cap), one silent.
    slow = [connect(url, f"127.0.0.{2 + i % 4}") for i in range(16)]
    for s in slow:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    silent = connect(url, "127.0.0.6")
    got = {s: b"" for s in [*slow, silent]}
    closed: set[socket.socket] = set()
    healthz = []
    deadline = time.monotonic() + 8
    while len(closed) < len(got) and time.monotonic() < deadline:
        for s in slow:
            if s not in closed:
                try:
                    s.sendall(b"X")         # a byte of a header name, every 0.2 s
                except OSError:
                    closed.add(s)
        readable, _, _ = select.select([s for s in got if s not in closed], [], [], 0.2)
        for s in readable:
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                data = b""
            got[s] += data
            if not data:
                closed.add(s)
        healthz.append(httpx.get(url + "/healthz").status_code)
    assert closed == set(got), f"{len(got) - len(closed)} connections still open"
    assert all(got[s].startswith(b"HTTP/1.1 408") and b"ANDREA_HEADER_TIMEOUT_S" in got[s]
               for s in slow if got[s]), [got[s][:60] for s in slow]
    assert got[silent] == b""           # nothing sent, nothing said: closed quietly
    assert healthz and set(healthz) == {200}


# ---- 3. one client address cannot hold every connection ----------------------------------------


def test_connections_past_the_per_client_cap_are_closed_at_once(served):
    proc, url, _ = served
    addr = "127.0.0.7"
    conns = [connect(url, addr) for _ in range(PER_CLIENT + 5)]
    assert httpx.get(url + "/healthz").status_code == 200       # another address is served
    # Each one ends: those past the cap at once with 503, the idle ones (no head sent) closed
    # silently by the header timeout. Counted once all have ended, however loaded the machine.
    ends = [read_all(s, 30) for s in conns]
    refused = [r for r in ends if r]
    assert len(refused) == 5 and ends.count(b"") == PER_CLIENT, [r[:40] for r in ends]
    assert all(r.startswith(b"HTTP/1.1 503") and b"ANDREA_MAX_CONNECTIONS_PER_CLIENT" in r
               and b"retry-after: 5" in r for r in refused)
    # Its idle connections freed, the address is served again.
    deadline = time.monotonic() + 30
    while True:
        s = connect(url, addr)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        if (reply := read_all(s)).startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:80]


# ---- 4. a stalled upload is dropped, and leaves nothing -----------------------------------------


def test_a_stalled_checkpoint_upload_is_dropped_and_leaves_nothing(served):
    proc, url, data = served
    run = new_run(url)
    body = state(run)
    s = connect(url)
    s.sendall(head("PUT", f"/api/runs/{run['id']}/checkpoints/1", run["token"],
                   content_length=len(body), x_andrea_chunk_sha256=digests(body))
              + body[:len(body) // 2])
    status, detail = answer(read_all(s))        # nothing more is sent
    assert status == 408 and "ANDREA_IDLE_TIMEOUT_S" in detail["detail"]
    assert "nothing was stored" in detail["detail"]
    assert httpx.get(f"{url}/api/runs/{run['id']}/checkpoints").json() == []
    assert not folder(data, run).exists() or list(folder(data, run).iterdir()) == []
    r = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=body,
                  headers=headers(run["token"], body))
    assert r.status_code == 201, r.text         # the run uploads again as if nothing happened
    assert sorted(p.name for p in folder(data, run).iterdir()) == ["000000001.ckpt",
                                                                    "000000001.json"]


def test_a_stalled_weights_upload_is_dropped_and_leaves_nothing(served):
    proc, url, data = served
    run = new_run(url)
    config = StoredRunConfig.model_validate(httpx.get(f"{url}/api/runs/{run['id']}").json()[
        "config"])
    body = b"\0" * (4 * run_layout(config)["total_numel"])
    s = connect(url)
    s.sendall(head("PUT", f"/api/runs/{run['id']}/weights", run["token"],
                   content_length=len(body)) + body[:len(body) // 2])
    status, detail = answer(read_all(s))
    assert status == 408 and "nothing was stored" in detail["detail"]
    assert sorted(p.name for p in run_dir(data, run["id"]).rglob("*") if p.is_file()) == []
    # More than the weights' size is refused by its Content-Length, before a byte is read.
    s = connect(url)
    s.sendall(head("PUT", f"/api/runs/{run['id']}/weights", run["token"],
                   content_length=len(body) + 1) + b"\0" * 100)
    status, detail = answer(read_all(s))
    assert status == 413 and "nothing was stored" in detail["detail"]
    r = httpx.put(f"{url}/api/runs/{run['id']}/weights", content=body,
                  headers={"authorization": f"Bearer {run['token']}"})
    assert r.status_code == 204, r.text
    assert [p.name for p in run_dir(data, run["id"]).rglob("*") if p.is_file()] \
        == ["weights.f32"]


# ---- 5. a download nobody reads is cut ----------------------------------------------------------


def test_a_download_the_client_stops_reading_is_cut(served):
    """83 MB: far more than the socket buffers hold."""
    proc, url, data = served
    run = new_run(url, preset="12m", optimizer="adamw_8bit")
    body = state(run)
    assert httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=body,
                     headers=headers(run["token"], body), timeout=60).status_code == 201
    time.sleep(0.3)                     # the connections above are gone
    fds = n_fds(proc.pid)
    s = connect(url, rcvbuf=4096)
    s.sendall(head("GET", f"/api/runs/{run['id']}/checkpoints/1", run["token"]))
    time.sleep(3)                       # reads nothing for 3 idle timeouts
    got = read_all(s)
    assert got.startswith(b"HTTP/1.1 200")
    assert len(got.partition(b"\r\n\r\n")[2]) < len(body)      # cut before the end
    deadline = time.monotonic() + 5
    while n_fds(proc.pid) > fds and time.monotonic() < deadline:
        time.sleep(0.1)
    assert n_fds(proc.pid) <= fds       # the server holds nothing for it


def test_a_body_that_comes_after_its_answer_is_not_taken_for_a_next_head(served):
    """A client whose request was answered before its body was sent (a refusal that reads no
    body: here the cross-site 403) sends the body after it, as httpx does (head and body are
    two writes), then keeps the connection for its next request. Those late body bytes are the
    answered request's, not a next head: the header timeout must not run on them (it answered
    408 to the next request on that connection once it sat idle past the timeout: a soak's
    well-behaved client saw it)."""
    _, url, _ = served
    run = new_run(url)
    s = connect(url)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(head("POST", f"/api/runs/{run['id']}/resume", content_length=2,
                   origin="http://evil.example"))
    first = one_response(s)
    assert first.startswith(b"HTTP/1.1 403"), first[:200]
    s.sendall(b"{}")                                 # the body, after its answer
    time.sleep(2.5)                                  # idle: past the 1 s header timeout
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    got = one_response(s)
    s.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:300]


def one_response(s: socket.socket, timeout: float = 30.0) -> bytes:
    """One whole answer on a kept-alive connection: its head, then content-length bytes (its
    head and body may come in separate reads)."""
    s.settimeout(timeout)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(1 << 16)
        assert chunk, got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(1 << 16)
        assert chunk, got
        body += chunk
    return head + b"\r\n\r\n" + body
