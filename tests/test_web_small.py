"""Five small bounds of the web layer (server/web/, runs/sweep.py, shown.py), each attack
against a real `andrea serve` (raw sockets, as tests/test_web_limits.py) or its pages. Before:
1. a server killed mid-branch left a hidden half-branch for ever, counted in X-Total-Count;
2. batches were gzipped (a 33 MB batch: 0.18 s plain, 11 s gzipped);
3. request heads of 66-125 KB passed the 64 KiB bound when they came in one read;
4. a byte every few seconds kept an upload alive for ever (only idle time was bounded);
5. bidi controls in run names, tags and shown text were shown as they are, so a name could
   visually reorder itself and the text around it.
Deadlines only bound the waits; nothing asserts how long the server took."""

from __future__ import annotations

import json
import select
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from andrea.cli.launch import start_server, stop_server
from andrea.data import wire
from andrea.model import run_layout
from andrea.paths import run_dir
from andrea.shown import BIDI_CONTROLS, shown_text
from andrea.store import Store
from andrea.store.run_rows import BRANCH_PAGE
from andrea.web.uvicorn_limits import MAX_HEAD_BYTES
from tests.test_checkpoints import digests, folder, headers, state
from tests.test_web_limits import answer, connect, head, new_run, read_all

# Any upload has 1 s, more at 256 KiB/s of its size: a 1.68 MB checkpoint 6.4 s, a 560 KB
# weights file 2.1 s, a JSON body 1 s. The idle timeout stays 30 s: it is never what bites here.
UPLOAD_S, RATE = 1.0, 256 << 10
ENV = {"ANDREA_UPLOAD_TIMEOUT_S": str(UPLOAD_S), "ANDREA_MIN_UPLOAD_BYTES_PER_S": str(RATE)}
CFG = {"preset": "tiny", "optimizer": "adamw"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data = tmp_path_factory.mktemp("small") / "data"
    proc, url = start_server(data, env=ENV)
    yield proc, url, data
    stop_server(proc)


def rec(step: int) -> dict:
    return {"step": step, "loss": 5.0 - step * 1e-5, "grad_norm": 1.0, "clip_scale": 1.0,
            "lr": 1e-3}


# ---- 1. a branch left half-copied by a killed server ---------------------------------------


def test_a_branch_left_half_copied_by_a_killed_server_is_never_shown_and_removed_at_start(
        tmp_path):
    data, step = tmp_path / "data", 25_000
    proc, url = start_server(data)
    try:
        parent = new_run(url, steps=100_000)
        pid = parent["id"]
        config = httpx.get(f"{url}/api/runs/{pid}").json()["config"]
        store = Store(data / "andrea.sqlite")   # the server's own file, beside it
        try:
            for first in range(1, 30_001, 10_000):
                store.add_metrics(pid, [rec(s) for s in range(first, first + 10_000)])
            # Where POST /api/runs {parent} stands when its server is killed mid-copy: the
            # checkpoint linked, the branch's row made, a first page of records copied.
            branch = "halfbranch01"
            store.begin_branch(branch, {**config, "parent": {"run": pid, "step": step}}, "h",
                               pid, step)
            assert store.copy_branch_page(branch, pid, step) == BRANCH_PAGE
        finally:
            store.close()
        ckpts = run_dir(data, branch) / "checkpoints"
        ckpts.mkdir(parents=True)
        for name in (f"{step:09d}.ckpt", f"{step:09d}.json"):
            (ckpts / name).write_bytes(b"linked from the parent")
        # Meanwhile (its copy under way, or its server gone): neither listed nor counted.
        r = httpx.get(url + "/api/runs")
        assert [x["id"] for x in r.json()] == [pid] and r.headers["x-total-count"] == "1"
        proc.kill()                             # kill -9: no shutdown, no cleanup
        proc.wait()
        proc, url = start_server(data)
        r = httpx.get(url + "/api/runs")
        assert [x["id"] for x in r.json()] == [pid] and r.headers["x-total-count"] == "1"
        assert httpx.get(f"{url}/api/runs/{branch}").status_code == 404
        assert not run_dir(data, branch).exists()
        assert "a branch left half-copied" in (data / "server.log").read_text()
    finally:
        stop_server(proc)
    store = Store(data / "andrea.sqlite")
    try:
        assert store.get_run(branch) is None and store.count_runs() == 1
        assert store.metrics(branch) == [] and store.events(branch) == []
        assert len(store.metrics(pid)) == 30_000        # the parent untouched
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_with_a_shared_store_only_branches_whose_copy_stopped_are_taken_for_dead(
        request, tmp_path, backend):
    """Processes that share a store cannot tell a dead process' copy from a live one but by
    its progress: every page touches the branch's row; one that stopped moving is dropped, and
    a copy that was dropped so (it had stalled) ends with a reason, never a half branch."""
    store = (Store(tmp_path / "s.sqlite") if backend == "sqlite"
             else Store(url=request.getfixturevalue("pg_url")))
    try:
        store.create_run("p", CFG, "hp")
        store.add_metrics("p", [rec(s) for s in range(1, 11)])
        store.begin_branch("old", CFG, "h1", "p", 5)
        mark = store.begin_branch("new", CFG, "h2", "p", 5)
        with store._tx(write=True) as db:      # both began long ago
            db.execute(text("UPDATE runs SET updated_at = updated_at - 1000"))
        assert store.copy_branch_page("new", "p", 5) == 5       # it moves: touched
        assert store.copy_branch_page("new", "p", 5) == 0       # (events: none; touched too)
        assert store.unfinished_branches(time.time() - 300) == ["old"]
        assert store.unfinished_branches() == ["new", "old"]
        assert store.count_runs() == 3 and store.count_runs(listed=True) == 1
        while store.drop_branch_page("new"):    # taken for a dead one by another process
            pass
        why_not = store.end_branch("new", "p", 5, mark)
        assert why_not and "branch it again" in why_not
        assert store.get_run("new") is None and store.events("new") == []
    finally:
        store.close()


# ---- 2. binary bodies are never gzipped ----------------------------------------------------


def test_a_batch_is_never_gzipped_and_a_json_answer_still_is(served):
    proc, url, _ = served
    run = new_run(url)
    gzip = {"accept-encoding": "gzip"}
    r = httpx.get(f"{url}/api/runs/{run['id']}/batches/1", headers=gzip, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == wire.MEDIA_TYPE
    assert "content-encoding" not in r.headers
    assert r.content[:4] == wire.MAGIC and int(r.headers["content-length"]) == len(r.content)
    assert len(r.content) > 1024                # past GZipMiddleware's minimum_size
    j = httpx.get(url + "/api/run_config", headers=gzip)
    assert j.status_code == 200 and j.headers["content-encoding"] == "gzip"
    assert "properties" in j.json()


# ---- 3. a request head is bounded exactly, however it is chunked ---------------------------


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


# ---- 4. an upload has a total time, from its size ------------------------------------------


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
    config = httpx.get(f"{url}/api/runs/{run['id']}").json()["config"]
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


# ---- 5. bidi controls in user text are neutralised where it is shown -----------------------

EVIL = "evil \u202egnp.exe"         # reads "evil exe.png" as it is


def test_the_run_page_and_404_page_show_user_text_isolated_and_neutralised(client):
    run = client.post("/api/runs", json={"preset": "tiny", "steps": 10}).json()
    r = client.patch(f"/api/runs/{run['id']}", json={"name": EVIL, "tags": ["\u2067tag"]})
    assert r.status_code == 200 and r.json()["name"] == EVIL        # stored as given
    html = client.get(f"/runs/{run['id']}").text
    assert not set(BIDI_CONTROLS) & set(html)
    assert '<bdi id="run-name">evil \ufffdgnp.exe</bdi>' in html
    assert "<title>evil \ufffdgnp.exe · Andrea</title>" in html
    r = client.get("/runs/%E2%80%AEabc%E2%81%A6")
    assert r.status_code == 404 and not set(BIDI_CONTROLS) & set(r.text)
    assert "There is no run \ufffdabc\ufffd on this server." in r.text


def test_the_pages_js_neutralises_the_same_characters_as_the_server():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    every = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000)
    script = ("import { shownText } from './static/js/app/text.js';"
              "let s = ''; process.stdin.on('data', (d) => { s += d; });"
              "process.stdin.on('end', () => process.stdout.write("
              "JSON.stringify(shownText(JSON.parse(s)))));")
    out = subprocess.run([node, "--input-type=module", "-e", script], input=json.dumps(every),
                         capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert json.loads(out) == shown_text(every)
    assert shown_text(EVIL) == "evil \ufffdgnp.exe" and len(BIDI_CONTROLS) == 12
