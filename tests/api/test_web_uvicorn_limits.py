"""Two bounds of uvicorn's reading (web/uvicorn_limits.py), each attack against a real `andrea
serve` over raw sockets: a request head is bounded exactly however it is chunked (heads of
66-125 KB used to pass the 64 KiB bound when they came in one read), and an upload has a total
time from its size (a byte every few seconds used to keep one alive for ever: only idle time
was bounded). Deadlines only bound the waits; nothing asserts how long the server took."""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest

from andrea.paths import run_dir
from andrea.run_config import StoredRunConfig, run_layout
from andrea.web.uvicorn_limits import MAX_HEAD_BYTES
from tests.api.test_checkpoints import digests, folder, headers, state
from tests.api.test_web_limits import answer, connect, head, new_run, read_all
from tests.servers import serve

# Any upload has 1 s, more at 256 KiB/s of its size: a 1.68 MB checkpoint 6.4 s, a 560 KB
# weights file 2.1 s, a JSON body 1 s. The idle timeout stays 30 s: it is never what bites here.
UPLOAD_S, RATE = 1.0, 256 << 10
LIMITS = {"upload_timeout_s": UPLOAD_S, "min_upload_bytes_per_s": RATE}
CFG = {"preset": "tiny", "optimizer": "adamw"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("small") / "data", **LIMITS) as s:
        yield s


def rec(step: int) -> dict:
    return {"step": step, "loss": 5.0 - step * 1e-5, "grad_norm": 1.0, "clip_scale": 1.0,
            "lr": 1e-3}


# ---- a request head is bounded exactly, however it is chunked ------------------------------------


def head_of(size: int) -> bytes:
    """A GET /healthz head of exactly `size` bytes, its blank line included."""
    start = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: "
    whole = start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"
    assert len(whole) == size
    return whole


def send_chunked(s: socket.socket, data: bytes, chunking: str) -> None:
    if chunking == "one send":
        s.sendall(data)
    elif chunking == "a byte a send":
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(data)):
            s.send(data[i:i + 1])
    else:       # all but the last byte, then it (the blank line split at the bound)
        s.sendall(data[:-1])
        time.sleep(0.3)             # (so that the server reads them apart)
        s.sendall(data[-1:])


@pytest.mark.parametrize("chunking", ["one send", "a byte a send", "split at the end"])
@pytest.mark.parametrize("size, status", [(MAX_HEAD_BYTES, b"200"),
                                          (MAX_HEAD_BYTES - 1, b"200"),
                                          (MAX_HEAD_BYTES + 1, b"431")])
def test_a_request_head_past_the_bound_gets_431_however_it_is_chunked(served, chunking, size,
                                                                       status):
    proc, url, _ = served
    s = connect(url)
    send_chunked(s, head_of(size), chunking)
    got = read_all(s, 30)
    assert got.startswith(b"HTTP/1.1 " + status), got[:80]
    if status == b"431":
        assert f"passed {MAX_HEAD_BYTES} bytes".encode() in got
    assert httpx.get(url + "/healthz").status_code == 200


# ---- an upload has a total time, from its size ---------------------------------------------------


def trickle(s: socket.socket, first: bytes, rest: bytes, every: float = 0.1,
            bound_s: float = 60) -> bytes:
    """Sends `first`, then `rest` a byte every `every` s until the server answers (or closes);
    returns what it said."""
    s.sendall(first)
    deadline = time.monotonic() + bound_s
    for i in range(len(rest)):
        if select.select([s], [], [], every)[0] or time.monotonic() > deadline:
            break
        try:
            s.send(rest[i:i + 1])
        except OSError:
            break
    return read_all(s, 30)


def test_a_trickled_json_body_gets_408_and_changes_nothing(served):
    proc, url, _ = served
    run = new_run(url)
    name = httpx.get(f"{url}/api/runs/{run['id']}").json()["name"]
    body = json.dumps({"name": "trickled " + "x" * 200}).encode()
    s = connect(url)
    got = trickle(s, head("PATCH", f"/api/runs/{run['id']}", run["token"],
                          content_length=len(body)), body)
    status, detail = answer(got)
    assert status == 408, detail
    assert "ANDREA_UPLOAD_TIMEOUT_S" in detail["detail"] and "nothing was stored" in \
        detail["detail"] and "ANDREA_IDLE_TIMEOUT_S" not in detail["detail"]
    assert httpx.get(f"{url}/api/runs/{run['id']}").json()["name"] == name


def test_a_trickled_weights_upload_gets_408_and_leaves_nothing(served):
    proc, url, data = served
    run = new_run(url)
    config = StoredRunConfig.model_validate(httpx.get(f"{url}/api/runs/{run['id']}").json()[
        "config"])
    body = b"\0" * (4 * run_layout(config)["total_numel"])      # 560 KB: 2.1 s at RATE
    s = connect(url)
    got = trickle(s, head("PUT", f"/api/runs/{run['id']}/weights", run["token"],
                          content_length=len(body)) + body[:len(body) // 2],
                  body[len(body) // 2:])
    status, detail = answer(got)
    assert status == 408 and "ANDREA_MIN_UPLOAD_BYTES_PER_S" in detail["detail"]
    assert f"({len(body)} bytes)" in detail["detail"] and "nothing was stored" in \
        detail["detail"]
    assert [p for p in run_dir(data, run["id"]).rglob("*") if p.is_file()] == []
    r = httpx.put(f"{url}/api/runs/{run['id']}/weights", content=body,
                  headers={"authorization": f"Bearer {run['token']}"})
    assert r.status_code == 204, r.text


def test_a_slow_upload_of_a_big_body_has_the_time_its_size_needs(served):
    """A checkpoint sent over longer than ANDREA_UPLOAD_TIMEOUT_S (10 pieces, 0.15 s apart),
    well within its size at ANDREA_MIN_UPLOAD_BYTES_PER_S (6.4 s): stored."""
    proc, url, data = served
    run = new_run(url)
    body = state(run)
    assert len(body) / RATE > 4 * 10 * 0.15 > UPLOAD_S
    s = connect(url)
    s.sendall(head("PUT", f"/api/runs/{run['id']}/checkpoints/1", run["token"],
                   content_length=len(body), x_andrea_chunk_sha256=digests(body)))
    piece = -(-len(body) // 10)
    for i in range(0, len(body), piece):
        time.sleep(0.15)
        s.sendall(body[i:i + piece])
    got = read_all(s, 30)
    assert got.startswith(b"HTTP/1.1 201"), got[:300]
    assert sorted(p.name for p in folder(data, run).iterdir()) == ["000000001.ckpt",
                                                                    "000000001.json"]
    r = httpx.get(f"{url}/api/runs/{run['id']}/checkpoints/1", headers=headers(run["token"]))
    assert r.status_code == 200 and r.content == body
