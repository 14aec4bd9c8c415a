"""Checkpoints on the server and resume: uploads are verified before they count, a failed or
killed upload never costs the previous checkpoint, one tab holds a run at a time, and a resume
or a branch continues from the checkpoint's step. Synthetic bytes of the right sizes stand in
for the engine's state (the engine's side is tested in tests/unit/gpu)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea import checkpoints
from andrea.app import create_app
from andrea.cli.launch import start_server, stop_server
from andrea.cli.main import main
from andrea.model import PRESETS, build_layout
from andrea.optim import checkpoint_sections, optimizer_memory
from andrea.run_config import form_fields
from andrea.web.deps import REVOKED
from tests import trainer_client
from tests.conftest import LocalClient

# ---- helpers ---------------------------------------------------------------------------------


def state(run: dict, seed: int = 0) -> bytes:
    """Random bytes of exactly the run's checkpoint size."""
    n = sum(s["bytes"] for s in run["checkpoint"]["sections"])
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def digests(body: bytes, chunk: int | None = None) -> str:
    chunk = chunk or checkpoints.CHUNK_BYTES
    return ",".join(hashlib.sha256(body[i:i + chunk]).hexdigest()
                    for i in range(0, max(len(body), 1), chunk))


def headers(token: str, body: bytes | None = None, chunk: int | None = None) -> dict:
    h = {"authorization": f"Bearer {token}"}
    if body is not None:
        h["x-andrea-chunk-sha256"] = digests(body, chunk)
    return h


def put(client, run: dict, step: int, body: bytes, token: str | None = None, **kw):
    return client.put(f"/api/runs/{run['id']}/checkpoints/{step}", content=body,
                      headers=headers(token or run["token"], body), **kw)


def new_run(client, **cfg) -> dict:
    return trainer_client.new_run(client, **{"steps": 50, **cfg})   # (50: its checkpoint cadence)


def steps(client, run: dict) -> list[int]:
    return [c["step"] for c in client.get(f"/api/runs/{run['id']}/checkpoints").json()]


def download(client, run: dict, step: int, token: str | None = None):
    return client.get(f"/api/runs/{run['id']}/checkpoints/{step}",
                      headers=headers(token or run["token"]))


def record(step: int) -> dict:
    return {"step": step, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}


def folder(data_dir, run: dict):
    return data_dir / "runs" / run["id"] / "checkpoints"


@pytest.fixture
def data_dir(settings):
    return settings.data_dir


def train_some(client, run: dict, last: int, status: str, samples=()) -> None:
    """What a training tab leaves behind: records 1..last, samples, a status; then it goes."""
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": [record(s) for s in range(1, last + 1)]})
        assert ws.receive_json() == {"type": "ack", "step": last}
        for s in samples:
            ws.send_json({"type": "sample", "step": s, "text": f"text {s}"})
        ws.send_json({"type": "status", "status": status})
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}


# ---- sections and the run JSON ---------------------------------------------------------------


@pytest.mark.parametrize("preset", list(PRESETS))
def test_sections_are_the_state_the_optimizer_allocates(preset):
    layout = build_layout(PRESETS[preset])
    memory = optimizer_memory(layout)
    for opt, names in (("adamw", ["W", "M", "V"]), ("adamw_8bit", ["W", "codes", "small"])):
        sections = checkpoint_sections(layout, opt, "fp32")
        assert [s["name"] for s in sections] == names
        assert sections[0]["bytes"] == 4 * layout["total_numel"]
        assert sum(s["bytes"] for s in sections[1:]) == memory[opt]["state_bytes"], opt


def test_run_json_says_how_to_checkpoint_and_whether_to_resume(client):
    run = new_run(client, optimizer="adamw_8bit", checkpoint_every=25)
    info = client.get(f"/api/runs/{run['id']}").json()
    layout = build_layout(PRESETS["tiny"])
    want = {"sections": checkpoint_sections(layout, "adamw_8bit", "fp32"),
            "chunk_bytes": 64 << 20, "every": 25, "last_step": None}
    assert run["checkpoint"] == info["checkpoint"] == want
    assert info["can_resume"] is False and "checkpoint_step" not in info
    assert client.get("/api/runs").json()[0]["checkpoint"] == want
    # The form offers checkpoint_every as an optional number, never the branch's parent.
    fields = form_fields()
    assert "parent" not in fields
    assert fields["checkpoint_every"] == {**fields["checkpoint_every"], "default": "", "min": 1,
                                          "step": 1, "required": False}
    assert client.post("/api/runs", json={"preset": "tiny", "checkpoint_every": 0}) \
        .status_code == 422
    bad_parent = {"preset": "tiny", "parent": {"run": "x", "step": 1, "more": 1}}
    assert client.post("/api/runs", json=bad_parent).status_code == 422


# ---- upload and download ---------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_8bit"])
def test_upload_and_download_round_trip(client, data_dir, optimizer):
    run = new_run(client, optimizer=optimizer)
    body = state(run)
    r = put(client, run, 5, body)
    assert r.status_code == 201, r.text
    sha = hashlib.sha256(body).hexdigest()
    assert r.json() == {"step": 5, "bytes": len(body), "sha256": sha}
    listed = client.get(f"/api/runs/{run['id']}/checkpoints").json()
    assert [{k: c[k] for k in ("step", "bytes", "sha256")} for c in listed] == [r.json()]
    assert listed[0]["created_at"] > 0
    got = download(client, run, 5)
    assert got.status_code == 200 and got.content == body
    assert got.headers["content-type"] == "application/octet-stream"
    sidecar = json.loads((folder(data_dir, run) / "000000005.json").read_text())
    assert sidecar["sections"] == run["checkpoint"]["sections"]
    assert sidecar["optimizer"] == optimizer and sidecar["sha256"] == sha
    assert sidecar["chunk_sha256"] == [hashlib.sha256(body).hexdigest()]
    info = client.get(f"/api/runs/{run['id']}").json()
    assert info["checkpoint"]["last_step"] == 5
    assert info["can_resume"] is False          # created: nobody trained it yet
    assert sorted(os.listdir(folder(data_dir, run))) == ["000000005.ckpt", "000000005.json"]


def test_only_the_newest_two_are_kept(client, data_dir):
    run = new_run(client)
    for step in (3, 6, 9):
        assert put(client, run, step, state(run, step)).status_code == 201
    assert steps(client, run) == [6, 9]
    assert sorted(os.listdir(folder(data_dir, run))) == [
        "000000006.ckpt", "000000006.json", "000000009.ckpt", "000000009.json"]
    assert download(client, run, 3).status_code == 404
    assert download(client, run, 6).content == state(run, 6)
    # The same step again with the same bytes changes nothing; with other bytes, replaces.
    assert put(client, run, 9, state(run, 9)).status_code == 201
    assert put(client, run, 9, state(run, 99)).status_code == 201
    assert download(client, run, 9).content == state(run, 99) and steps(client, run) == [6, 9]


def test_a_truncated_upload_keeps_the_previous_checkpoint(client, data_dir):
    run = new_run(client)
    good = state(run)
    assert put(client, run, 2, good).status_code == 201
    short = good[:-100]
    r = client.put(f"/api/runs/{run['id']}/checkpoints/4", content=short,
                   headers=headers(run["token"], good))
    assert r.status_code == 400 and "truncated" in r.json()["detail"], r.text

    def stream():               # no Content-Length: the body just ends early
        yield short[:1000]
        yield short[1000:]
    r = client.put(f"/api/runs/{run['id']}/checkpoints/4", content=stream(),
                   headers=headers(run["token"], good))
    assert r.status_code == 400 and f"is {len(short)} bytes" in r.json()["detail"], r.text
    assert steps(client, run) == [2] and download(client, run, 2).content == good
    assert sorted(os.listdir(folder(data_dir, run))) == ["000000002.ckpt", "000000002.json"]


def test_a_corrupted_chunk_is_refused_and_the_previous_stays(client, data_dir, monkeypatch):
    monkeypatch.setattr(checkpoints, "CHUNK_BYTES", 256 << 10)   # tiny: 7 chunks
    run = new_run(client)
    assert client.get(f"/api/runs/{run['id']}").json()["checkpoint"]["chunk_bytes"] == 256 << 10
    good = state(run)
    assert put(client, run, 2, good).status_code == 201
    bad = bytearray(state(run, 1))
    sent = digests(bytes(bad))
    bad[3 * (256 << 10) + 17] ^= 1                  # a bit flipped on the way, in chunk 3
    r = client.put(f"/api/runs/{run['id']}/checkpoints/4", content=bytes(bad),
                   headers={**headers(run["token"]), "x-andrea-chunk-sha256": sent})
    assert r.status_code == 400 and "chunk 3 " in r.json()["detail"], r.text
    r = client.put(f"/api/runs/{run['id']}/checkpoints/4", content=bytes(bad),
                   headers={**headers(run["token"]), "x-andrea-chunk-sha256": sent[:64]})
    assert r.status_code == 400 and "7 chunks" in r.json()["detail"], r.text
    assert steps(client, run) == [2] and download(client, run, 2).content == good
    assert len(os.listdir(folder(data_dir, run))) == 2


def test_wrong_token_unknown_run_and_steps_out_of_range(client):
    run = new_run(client, steps=10)
    body = state(run)
    r = put(client, run, 1, body, token="guess")
    assert r.status_code == 403 and "wrong" in r.json()["detail"]
    assert client.put(f"/api/runs/{run['id']}/checkpoints/1", content=body).status_code == 403
    assert put(client, {**run, "id": "nope"}, 1, body).status_code == 404
    assert put(client, run, 0, body).status_code == 409
    r = put(client, run, 11, body)
    assert r.status_code == 409 and "1..10" in r.json()["detail"]
    assert put(client, run, 10, body).status_code == 201
    assert download(client, run, 10, token="guess").status_code == 403
    assert client.get(f"/api/runs/{run['id']}/checkpoints/10").status_code == 401  # no token
    assert download(client, run, 9).status_code == 404


def test_an_oversized_upload_is_413(client):
    run = new_run(client)
    body = state(run)
    r = client.put(f"/api/runs/{run['id']}/checkpoints/1", content=body + b"x",
                   headers=headers(run["token"], body))
    assert r.status_code == 413 and "or more" not in r.json()["detail"], r.text

    def stream():              # no Content-Length: refused once past the size
        yield body
        yield b"more"
    r = client.put(f"/api/runs/{run['id']}/checkpoints/1", content=stream(),
                   headers=headers(run["token"], body))
    assert r.status_code == 413 and "or more" in r.json()["detail"], r.text
    assert steps(client, run) == []


def test_an_oversized_upload_is_refused_before_it_is_read(live):
    """A body declared 1 GB larger is answered at once, without waiting for it."""
    url, _ = live
    run = httpx.post(url + "/api/runs", json={"preset": "tiny"}).json()
    size = sum(s["bytes"] for s in run["checkpoint"]["sections"]) + (1 << 30)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall((f"PUT /api/runs/{run['id']}/checkpoints/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Authorization: Bearer {run['token']}\r\nContent-Length: {size}\r\n"
                   f"X-Andrea-Chunk-SHA256: {'0' * 64}\r\n\r\n").encode() + b"\0" * 4096)
        reply = s.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413"), reply


def test_a_checkpoint_of_another_layout_or_optimizer_is_refused(client):
    run = new_run(client)                                    # tiny, adamw
    eight_bit = sum(s["bytes"] for s in checkpoint_sections(build_layout(PRESETS["tiny"]),
                                                            "adamw_8bit", "fp32"))
    other = b"\0" * eight_bit
    r = client.put(f"/api/runs/{run['id']}/checkpoints/1", content=other,
                   headers=headers(run["token"], other))
    assert r.status_code == 400, r.text
    assert "tiny with adamw: W 559616 + M 559616 + V 559616" in r.json()["detail"]
    put(client, run, 1, state(run))
    r = client.post("/api/runs", json={"preset": "tiny", "optimizer": "adamw_8bit",
                                       "parent": {"run": run["id"], "step": 1}})
    assert r.status_code == 409 and "model and optimizer" in r.json()["detail"], r.text
    r = client.post("/api/runs", json={"preset": "12m", "parent": {"run": run["id"], "step": 1}})
    assert r.status_code == 409, r.text
    assert len(client.get("/api/runs").json()) == 1         # nothing half-made


# ---- resume ----------------------------------------------------------------------------------


def test_resume_deletes_what_came_after_the_checkpoint(client, data_dir):
    run = new_run(client)
    train_some(client, run, 10, "stopped", samples=(4, 8))
    body = state(run)
    assert put(client, run, 6, body).status_code == 201
    info = client.get(f"/api/runs/{run['id']}").json()
    assert info["can_resume"] is True and info["checkpoint"]["last_step"] == 6
    r = client.post(f"/api/runs/{run['id']}/resume")
    assert r.status_code == 200, r.text
    resumed = r.json()
    assert set(resumed) == {"token", "step", "run"} and resumed["step"] == 6
    assert resumed["token"] != run["token"]
    assert resumed["run"]["status"] == "created" and resumed["run"]["message"] is None
    assert resumed["run"]["can_resume"] is False and resumed["run"]["last_step"] == 6
    assert [m["step"] for m in client.get(f"/api/runs/{run['id']}/metrics").json()] == \
        list(range(1, 7))
    detail = client.get(f"/api/runs/{run['id']}").json()
    assert [s["step"] for s in detail["samples"]] == [4]
    # The event is there for viewers (the watch socket replays events after the backlog).
    with client.websocket_connect(f"/ws/runs/{run['id']}/watch") as viewer:
        seen = [viewer.receive_json() for _ in range(4)]
    assert {"type": "resumed", "kind": "resumed", "step": 6} in seen, seen
    # The new token trains on from step 6; the checkpoint downloads with it.
    assert download(client, run, 6, token=resumed["token"]).content == body
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": resumed["token"], "last_acked_step": 6})
        assert ws.receive_json()["last_committed_step"] == 6
    # A run made but never started, or without a checkpoint, has nothing to resume.
    assert client.post(f"/api/runs/{run['id']}/resume").status_code == 409   # created now
    other = new_run(client)
    train_some(client, other, 3, "stopped")
    r = client.post(f"/api/runs/{other['id']}/resume")
    assert r.status_code == 404 and "no checkpoint" in r.json()["detail"]
    assert client.post("/api/runs/nope/resume").status_code == 404


def test_a_resume_whose_tab_never_comes_can_be_resumed_again(tmp_path):

    from andrea.app import create_app
    from andrea.config import Settings
    from tests.conftest import LocalClient

    with LocalClient(create_app(Settings(data_dir=tmp_path, trainer_grace_s=0.3))) as c:
        run = new_run(c)
        train_some(c, run, 2, "paused")
        assert put(c, run, 2, state(run)).status_code == 201
        # (That a second resume is refused while the first is pending is the test above's,
        # under the default grace: with 0.3 s it would race a loaded machine.)
        assert c.post(f"/api/runs/{run['id']}/resume").status_code == 200
        deadline = time.monotonic() + 10
        while not c.get(f"/api/runs/{run['id']}").json()["can_resume"]:
            assert time.monotonic() < deadline, "stayed created"
            time.sleep(0.05)
        info = c.get(f"/api/runs/{run['id']}").json()
        assert info["status"] == "interrupted" and "resumed" in info["message"]
        assert c.post(f"/api/runs/{run['id']}/resume").status_code == 200


def test_a_revoked_token_is_refused_with_its_reason(client):
    run = new_run(client)
    train_some(client, run, 4, "running")
    assert put(client, run, 4, state(run)).status_code == 201
    new = client.post(f"/api/runs/{run['id']}/resume").json()["token"]
    r = put(client, run, 5, state(run))
    assert r.status_code == 403 and r.json()["detail"] == REVOKED
    assert download(client, run, 4).status_code == 403
    assert client.put(f"/api/runs/{run['id']}/weights", content=b"",
                      headers=headers(run["token"])).json()["detail"] == REVOKED
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json() == {"type": "error", "message": REVOKED, "kind": "revoked"}
        assert ws.receive()["code"] == 1008
    assert put(client, run, 5, state(run), token=new).status_code == 201


def test_one_trainer_per_run_and_no_resume_under_it(live):
    url, _ = live
    run = httpx.post(url + "/api/runs", json={"preset": "tiny"}).json()
    ws_url = url.replace("http://", "ws://") + f"/ws/runs/{run['id']}"
    with connect(ws_url) as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"]}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        ws.send(json.dumps({"type": "status", "status": "running"}))
        ws.send(json.dumps({"type": "metrics", "records": [record(1)]}))   # record 1 first
        assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "step": 1}
        r = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=state(run),
                      headers=headers(run["token"], state(run)))
        assert r.status_code == 201, r.text
        with connect(ws_url) as second:
            second.send(json.dumps({"type": "hello", "token": run["token"]}))
            assert json.loads(second.recv(timeout=10)) == {
                "type": "error", "message": "another trainer holds this run", "kind": "busy"}
            with pytest.raises(ConnectionClosed) as e:
                second.recv(timeout=10)
            assert e.value.rcvd.code == 1008
        r = httpx.post(f"{url}/api/runs/{run['id']}/resume")
        assert r.status_code == 409 and "trainer is connected" in r.json()["detail"]
        assert httpx.get(f"{url}/api/runs/{run['id']}").json()["can_resume"] is False
    deadline = time.monotonic() + 10      # the server notices the socket is gone
    while not httpx.get(f"{url}/api/runs/{run['id']}").json()["can_resume"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.post(f"{url}/api/runs/{run['id']}/resume").status_code == 200


def test_two_resumes_at_once_one_wins(live):
    url, _ = live
    run = httpx.post(url + "/api/runs", json={"preset": "tiny"}).json()
    with connect(url.replace("http://", "ws://") + f"/ws/runs/{run['id']}") as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"]}))
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "status", "status": "paused"}))
        ws.send(json.dumps({"type": "metrics", "records": [record(s) for s in (1, 2, 3)]}))
        assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "step": 3}
        body = state(run)
        assert httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/3", content=body,
                         headers=headers(run["token"], body)).status_code == 201
    time.sleep(0.2)
    for attempt in range(3):        # each round: two tabs press "resume" at the same moment
        barrier, codes = threading.Barrier(2), []

        def press():
            barrier.wait()
            codes.append(httpx.post(f"{url}/api/runs/{run['id']}/resume", timeout=10))
        threads = [threading.Thread(target=press) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert sorted(r.status_code for r in codes) == [200, 409], [r.text for r in codes]
        winner = next(r.json() for r in codes if r.status_code == 200)
        with connect(url.replace("http://", "ws://") + f"/ws/runs/{run['id']}") as ws:
            ws.send(json.dumps({"type": "hello", "token": winner["token"]}))
            assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
            ws.send(json.dumps({"type": "status", "status": "stopped"}))
        deadline = time.monotonic() + 10
        while not httpx.get(f"{url}/api/runs/{run['id']}").json()["can_resume"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_failed_run_resumes_from_its_last_checkpoint(client):
    """Whatever failed it, a failed run is not lost: it goes on from its last checkpoint."""
    run = new_run(client)
    train_some(client, run, 9, "failed")
    for step in (4, 8):
        assert put(client, run, step, state(run, step)).status_code == 201
    info = client.get(f"/api/runs/{run['id']}").json()
    assert info["status"] == "failed" and info["can_resume"] is True
    r = client.post(f"/api/runs/{run['id']}/resume")
    assert r.status_code == 200, r.text
    assert r.json()["step"] == 8 and r.json()["run"]["status"] == "created"
    assert steps(client, run) == [4, 8]
    assert [m["step"] for m in client.get(f"/api/runs/{run['id']}/metrics").json()] == \
        list(range(1, 9))


def test_a_resume_on_a_server_with_other_text_is_refused_with_nothing_changed(
        client, settings, tmp_path):
    """The same data dir served with another corpus: the resume is refused before a token is
    issued or a record dropped (it used to issue a token, start the tab, and fail the run at its
    first batch); on the right server it then resumes as before."""
    run = new_run(client)
    train_some(client, run, 9, "stopped")
    assert put(client, run, 8, state(run, 8)).status_code == 201
    before = client.get(f"/api/runs/{run['id']}").json()
    mine = tmp_path / "mine.txt"
    mine.write_text("other text entirely. " * 2000)
    other = settings.model_copy(update={"corpora": (("mine", mine),), "only_corpus": True})
    with LocalClient(create_app(other)) as elsewhere:
        r = elsewhere.post(f"/api/runs/{run['id']}/resume")
        assert r.status_code == 409, r.text
        assert "cannot resume here" in r.json()["detail"]
        assert before["config"]["corpus_hash"] in r.json()["detail"]
        assert elsewhere.get(f"/api/runs/{run['id']}").json() == before
    assert client.get(f"/api/runs/{run['id']}").json() == before
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:     # the old token still holds
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json()["type"] == "welcome"
    r = client.post(f"/api/runs/{run['id']}/resume")
    assert r.status_code == 200 and r.json()["step"] == 8


# ---- branch ----------------------------------------------------------------------------------


def test_a_failed_run_branches_into_a_new_run_with_another_lr(client, data_dir):
    run = new_run(client, lr=3e-3)
    train_some(client, run, 9, "failed", samples=(2, 8))
    for step in (4, 8):
        assert put(client, run, step, state(run, step)).status_code == 201
    assert client.get(f"/api/runs/{run['id']}").json()["can_resume"] is True
    r = client.post("/api/runs", json={"preset": "tiny", "steps": 50, "lr": 1e-4,
                                       "parent": {"run": run["id"], "step": 4}})
    assert r.status_code == 201, r.text
    branch = r.json()
    assert branch["id"] != run["id"] and branch["config"]["lr"] == 1e-4
    assert branch["config"]["parent"] == {"run": run["id"], "step": 4}
    assert branch["checkpoint"]["last_step"] == 4
    assert steps(client, branch) == [4]
    assert download(client, branch, 4, token=branch["token"]).content == state(run, 4)
    # Hard-linked: one file on disk for both runs.
    src, dst = folder(data_dir, run) / "000000004.ckpt", folder(data_dir, branch) / "000000004.ckpt"
    assert os.stat(src).st_ino == os.stat(dst).st_ino
    info = client.get(f"/api/runs/{branch['id']}").json()
    assert info["status"] == "created" and info["last_step"] == 4
    assert [s["step"] for s in info["samples"]] == [2]
    assert [m["step"] for m in client.get(f"/api/runs/{branch['id']}/metrics").json()] == \
        [1, 2, 3, 4]
    with client.websocket_connect(f"/ws/runs/{branch['id']}") as ws:
        ws.send_json({"type": "hello", "token": branch["token"]})
        assert ws.receive_json()["last_committed_step"] == 4
    # The parent is untouched; pruning it later leaves the branch's file alone.
    assert steps(client, run) == [4, 8]
    for step in (9, 10):
        put(client, run, step, state(run, step))
    assert download(client, branch, 4, token=branch["token"]).content == state(run, 4)
    # What a branch cannot be.
    for parent, code in (({"run": "nope", "step": 4}, 404), ({"run": run["id"], "step": 5}, 404),
                         ({"run": run["id"], "step": 9}, 201)):
        r = client.post("/api/runs", json={"preset": "tiny", "steps": 50, "parent": parent})
        assert r.status_code == code, (parent, r.text)
    r = client.post("/api/runs", json={"preset": "tiny", "steps": 9,
                                       "parent": {"run": run["id"], "step": 9}})
    assert r.status_code == 409 and "more than" in r.json()["detail"]


# ---- export from a checkpoint ----------------------------------------------------------------


def test_export_step_is_the_checkpoints_weights(client, settings, tmp_path, capsys):
    from safetensors.numpy import load

    run = new_run(client, optimizer="adamw_8bit")
    body = state(run)
    w = np.frombuffer(body[:run["checkpoint"]["sections"][0]["bytes"]], dtype="<f4")
    w = np.nan_to_num(w.copy())            # random bytes: keep the comparison about bits
    body = w.tobytes() + body[w.nbytes:]
    assert put(client, run, 7, body).status_code == 201
    served = client.get(f"/api/runs/{run['id']}/model.safetensors?step=7")
    assert served.status_code == 200, served.text
    tensors = load(served.content)
    for p in run["layout"]["params"]:
        want = w[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"])
        assert np.array_equal(tensors[p["name"]], want), p["name"]
    assert client.get(f"/api/runs/{run['id']}/model.safetensors?step=6").status_code == 404
    assert client.get(f"/api/runs/{run['id']}/model.safetensors").status_code == 404  # no W yet
    z = client.get(f"/api/runs/{run['id']}/export.zip?step=7")
    assert z.status_code == 200 and z.content[:2] == b"PK"
    out = tmp_path / "hf"
    args = ["export", run["id"], "--step", "7", "--out", str(out), "--data-dir",
            str(settings.data_dir)]
    assert main(args) == 0
    assert (out / "model.safetensors").read_bytes() == served.content
    assert f"andrea export {run['id']} --step 7 --out DIR" in (out / "README.md").read_text()
    assert main(args[:3] + ["6"] + args[4:]) == 2       # not found, as an unknown run is
    assert "no checkpoint at step 6" in capsys.readouterr().err
    # A damaged file is never exported (nor served).
    path = folder(settings.data_dir, run) / "000000007.ckpt"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    assert main(args) == 1 and "damaged" in capsys.readouterr().err
    r = download(client, run, 7)
    assert r.status_code == 500 and "damaged" in r.json()["detail"]


# ---- a real server dies, or its disk fills up ------------------------------------------------


@pytest.fixture
def live(tmp_path):
    """`andrea serve` of this test alone: (url, data dir)."""
    proc, url = start_server(tmp_path / "data")
    try:
        yield url, tmp_path / "data"
    finally:
        stop_server(proc)



def only_checkpoint_1(url: str, run: dict, good: bytes, ckdir) -> None:
    """The run's one checkpoint is step 1, whole: listed, served byte for byte, on disk alone
    (no part file, no step 2)."""
    assert [c["step"] for c in httpx.get(f"{url}/api/runs/{run['id']}/checkpoints").json()] \
        == [1]
    got = httpx.get(f"{url}/api/runs/{run['id']}/checkpoints/1", headers=headers(run["token"]),
                    timeout=60)
    assert got.status_code == 200 and got.content == good
    assert sorted(os.listdir(ckdir)) == ["000000001.ckpt", "000000001.json"]


def test_a_server_killed_mid_upload_keeps_the_previous_checkpoint(tmp_path):
    data = tmp_path / "data"
    proc, url = start_server(data)
    try:
        run = httpx.post(url + "/api/runs", json={"preset": "12m", "optimizer": "adamw_8bit"}) \
            .json()
        good = state(run)                               # 83 MB
        r = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=good,
                      headers=headers(run["token"], good), timeout=60)
        assert r.status_code == 201, r.text
        ckdir = folder(data, run)
        host, port = url.removeprefix("http://").split(":")
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall((f"PUT /api/runs/{run['id']}/checkpoints/2 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Authorization: Bearer {run['token']}\r\nContent-Length: {len(good)}\r\n"
                   f"X-Andrea-Chunk-SHA256: {digests(good)}\r\n\r\n").encode())
        s.sendall(good[:40 << 20])                      # half of it, then the server dies
        deadline = time.monotonic() + 20
        while not any(p.name.endswith(".part") and p.stat().st_size >= 8 << 20
                      for p in ckdir.iterdir()):
            assert time.monotonic() < deadline, "the upload never reached the disk"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        s.close()
    finally:
        stop_server(proc)
    assert any(p.name.endswith(".part") for p in ckdir.iterdir())    # what the crash left
    proc, url = start_server(data)                                    # the same data dir
    try:
        only_checkpoint_1(url, run, good, ckdir)
        assert httpx.get(f"{url}/api/runs/{run['id']}").json()["checkpoint"]["last_step"] == 1
    finally:
        stop_server(proc)


def test_a_full_disk_answers_507_and_keeps_the_previous_checkpoint(tmp_path):
    data = tmp_path / "data"
    proc, url = start_server(data)
    try:
        run = httpx.post(url + "/api/runs", json={"preset": "tiny"}).json()
        good = state(run)                                          # 1.7 MB
        assert httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=good,
                         headers=headers(run["token"], good)).status_code == 201
    finally:
        stop_server(proc)
    proc, url = start_server(data, file_limit=1 << 20)              # no file past 1 MiB
    try:
        other = state(run, 1)
        r = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/2", content=other,
                      headers=headers(run["token"], other))
        assert r.status_code == 507, r.text
        assert "EFBIG" in r.json()["detail"] and "previous checkpoints are kept" in \
            r.json()["detail"]
        only_checkpoint_1(url, run, good, folder(data, run))
    finally:
        stop_server(proc)


def test_resume_and_branch_only_from_checkpoints_whose_records_are_committed(client):
    """A tab that dies right after uploading checkpoint K may not have sent record K: the run
    resumes from the newest checkpoint at or before its last committed step, never with a hole."""
    run = new_run(client)
    train_some(client, run, 9, "stopped")            # records 1..9 committed
    body = state(run)
    assert put(client, run, 5, body).status_code == 201
    assert put(client, run, 10, body).status_code == 201   # record 10 never arrived
    branch = client.post("/api/runs", json={"preset": "tiny", "steps": 200, "lr": 1e-3,
                                            "parent": {"run": run["id"], "step": 10}})
    assert branch.status_code == 409 and "committed up to step 9" in branch.json()["detail"]
    r = client.post(f"/api/runs/{run['id']}/resume")
    assert r.status_code == 200 and r.json()["step"] == 5, r.text
    assert [m["step"] for m in client.get(f"/api/runs/{run['id']}/metrics").json()] == \
        list(range(1, 6))


def test_a_resume_drops_the_checkpoints_of_the_timeline_it_abandons(tmp_path):
    """Checkpoint 10 of a tab that died before record 10, after a resume from 5: kept, it held
    a kept slot and the run's checkpoint step (after an upload, or a restart: the resumed tab
    would then load 10 over records that end at 5), and a tab of the new timeline that died
    after uploading 7 left the run with no checkpoint to resume from."""
    from andrea.config import Settings

    data = tmp_path / "d"
    with LocalClient(create_app(Settings(data_dir=data))) as c:
        run = new_run(c)
        train_some(c, run, 9, "stopped")
        assert put(c, run, 5, state(run)).status_code == 201
        assert put(c, run, 10, state(run, 1)).status_code == 201   # record 10 never arrived
        r = c.post(f"/api/runs/{run['id']}/resume")
        assert r.status_code == 200 and r.json()["step"] == 5, r.text
        token = r.json()["token"]
        assert steps(c, run) == [5]
    with LocalClient(create_app(Settings(data_dir=data))) as c:   # a restart before the tab
        assert c.get(f"/api/runs/{run['id']}").json()["checkpoint"]["last_step"] == 5
        train_some(c, {**run, "token": token}, 6, "stopped")
        assert put(c, run, 7, state(run, 2), token=token).status_code == 201   # record 7 never
        assert c.get(f"/api/runs/{run['id']}").json()["checkpoint"]["last_step"] == 7
        assert steps(c, run) == [5, 7]
        r = c.post(f"/api/runs/{run['id']}/resume")
        assert r.status_code == 200 and r.json()["step"] == 5, r.text


def test_resume_and_branch_pick_their_checkpoint_by_one_rule():
    """services/runs.py (resume) and headless.py (`--branch RUN` without a step) both ask
    checkpoints.newest_usable: the newest checkpoint at or before the last committed record."""
    metas = [{"step": s} for s in (5, 10, 15)]
    assert checkpoints.newest_usable(metas, 12) == 10
    assert checkpoints.newest_usable(metas, 15) == 15
    assert checkpoints.newest_usable(metas, 4) is None
    assert checkpoints.newest_usable(metas, None) is None
    assert checkpoints.newest_usable([], 9) is None


# ---- a delete that races a resume or an upload -----------------------------------------------


def test_a_resume_racing_a_delete_is_404(client, data_dir, monkeypatch):
    """The delete takes the run's lock first: the resume that waited for it finds no run."""
    from contextlib import asynccontextmanager

    from andrea.services import runs as service

    run = new_run(client)
    train_some(client, run, 6, "stopped")
    assert put(client, run, 6, state(run)).status_code == 201
    store, real = client.app.state.store, service.no_trainer

    @asynccontextmanager
    async def deleted_first(fanout, run_id, busy):
        store.runs.delete(run_id)            # what a DELETE does under the same lock
        async with real(fanout, run_id, busy):
            yield

    monkeypatch.setattr(service, "no_trainer", deleted_first)
    r = client.post(f"/api/runs/{run['id']}/resume")
    assert r.status_code == 404 and "deleted" in r.json()["detail"], r.text


def _upload_then_delete(url: str, data, kind: str):
    """A PUT of the run's weights or checkpoint 1 whose body stops halfway until the run has
    been deleted: (the DELETE's answer, the PUT's answer)."""
    run = httpx.post(url + "/api/runs", json={"preset": "tiny", "steps": 50}).json()
    if kind == "weights":
        body = bytes(4 * run["layout"]["total_numel"])
        path, h = f"/api/runs/{run['id']}/weights", headers(run["token"])
    else:
        body = state(run)
        path, h = f"/api/runs/{run['id']}/checkpoints/1", headers(run["token"], body)
    deleted, half = threading.Event(), len(body) // 2

    def gen():
        yield body[:half]
        deleted.wait(30)
        yield body[half:]
    answer = {}

    def upload():
        answer["put"] = httpx.put(url + path, content=gen(), timeout=60,
                                  headers={**h, "content-length": str(len(body))})
    t = threading.Thread(target=upload)
    t.start()
    deadline = time.time() + 30     # the upload has begun: its file is on disk
    while not any((data / "runs" / run["id"]).rglob("*.part*")) and time.time() < deadline:
        time.sleep(0.02)
    gone = httpx.delete(f"{url}/api/runs/{run['id']}", timeout=60)
    deleted.set()
    t.join(60)
    return run, gone, answer["put"]


@pytest.mark.parametrize("kind", ["weights", "checkpoint"])
def test_a_delete_during_an_upload_is_clean(live, kind):
    url, data = live
    run, gone, put_answer = _upload_then_delete(url, data, kind)
    assert gone.status_code == 204, gone.text
    assert put_answer.status_code == 404, put_answer.text
    assert "deleted during the upload" in put_answer.json()["detail"]
    assert not (data / "runs" / run["id"]).exists()
    assert httpx.get(f"{url}/api/runs/{run['id']}").status_code == 404
    assert "Traceback" not in (data / "server.log").read_text()


def test_a_checkpoint_upload_cut_short_logs_one_quiet_line(live):
    url, data = live
    run = httpx.post(url + "/api/runs", json={"preset": "tiny", "steps": 50}).json()
    body = state(run)
    host, port = url.removeprefix("http://").split(":")
    head = (f"PUT /api/runs/{run['id']}/checkpoints/1 HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {run['token']}\r\n"
            f"X-Andrea-Chunk-SHA256: {digests(body)}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head + body[:len(body) // 2])
        deadline = time.time() + 30     # the upload has begun
        while not any(folder(data, run).glob("*.part*")) and time.time() < deadline:
            time.sleep(0.02)
    log = data / "server.log"
    deadline = time.time() + 30     # the server's handling ends: logged, then the part removed
    while ("aborted by the client" not in log.read_text() or any(folder(data, run).iterdir())) \
            and time.time() < deadline:
        time.sleep(0.05)
    text = log.read_text()
    assert sum("aborted by the client" in line for line in text.splitlines()) == 1, text
    assert "Traceback" not in text and "ClientDisconnect" not in text, text
    assert list(folder(data, run).iterdir()) == []      # no part file left


def test_two_weights_uploads_at_once_each_write_their_own_file(live):
    """A retry while the first upload still streams: each has its own temp file, and the last
    one stored is whole (they once shared weights.part: the first to finish renamed it into
    place, and the other went on writing into the stored weights after their 204)."""
    url, data = live
    run = httpx.post(url + "/api/runs", json={"preset": "tiny", "steps": 50}).json()
    n = 4 * run["layout"]["total_numel"]
    first, second = b"\x01" * n, b"\x02" * n
    path, h = f"{url}/api/runs/{run['id']}/weights", headers(run["token"])
    go = threading.Event()

    def gen():
        yield first[:n // 2]
        go.wait(30)
        yield first[n // 2:]
    answer = {}
    t = threading.Thread(target=lambda: answer.setdefault("first", httpx.put(
        path, content=gen(), headers={**h, "content-length": str(n)}, timeout=60)))
    t.start()
    deadline = time.time() + 30     # the first upload has begun: its file is on disk
    while not any((data / "runs" / run["id"]).glob("*.part")) and time.time() < deadline:
        time.sleep(0.02)
    assert httpx.put(path, content=second, headers=h, timeout=60).status_code == 204
    stored = data / "runs" / run["id"] / "weights.f32"
    assert stored.read_bytes() == second
    go.set()
    t.join(60)
    assert answer["first"].status_code == 204, answer["first"].text
    assert stored.read_bytes() == first                       # the later one, whole
    assert not list((data / "runs" / run["id"]).glob("*.part"))


def test_a_start_removes_uploads_a_crash_cut_short(tmp_path):
    """Temp files of the weights, a room body or a room state's rewrite, left by a process that
    died: removed at the next start; on a data dir that processes share, only once idle."""
    run = tmp_path / "runs" / "r1"
    (run / "room").mkdir(parents=True)
    left = [run / "weights.f32abc.part", run / "room" / "xyz.part",
            run / "room" / "state.json.q1.part"]
    for p in left:
        p.write_bytes(b"half")
    (run / "weights.f32").write_bytes(b"whole")
    checkpoints.CheckpointStore(tmp_path, kept=2, shared=True).recover()
    assert all(p.exists() for p in left)                      # maybe another process's
    checkpoints.CheckpointStore(tmp_path, kept=2).recover()
    assert not any(p.exists() for p in left)
    assert (run / "weights.f32").read_bytes() == b"whole"


def test_a_starting_process_leaves_another_ones_commit_alone(tmp_path, monkeypatch):
    """Processes sharing a data dir: one starting up (recover) while another is between its
    checkpoint's rename and its sidecar's write must not take the .ckpt for garbage."""
    serving = checkpoints.CheckpointStore(tmp_path, kept=2, shared=True)
    starting = checkpoints.CheckpointStore(tmp_path, kept=2, shared=True)
    body = b"x" * 1000
    real = checkpoints.write_atomic

    def sidecar_write(path, data):
        starting.recover()          # lands between os.replace(.ckpt) and the sidecar
        real(path, data)
    up = serving.begin("r1", 3, len(body), [hashlib.sha256(body).hexdigest()],
                       checkpoints.CHUNK_BYTES)
    up.write(body)
    monkeypatch.setattr(checkpoints, "write_atomic", sidecar_write)
    serving.commit("r1", up, "adamw", [{"name": "w", "bytes": len(body)}])
    assert [m["step"] for m in serving.list("r1")] == [3]
    meta, f = serving.open_verified("r1", 3)
    with f:
        assert f.read() == body


def test_a_stop_between_a_runs_row_and_its_files_leaves_no_files_behind(tmp_path):
    """A delete commits the row's removal, then removes the files; a branch links its files,
    then writes its row. A stop in between left files no run owns, for good. Marked first
    (runs/sweep.py mark_unsettled), they are removed at the next start; a marked run whose row
    is there is kept, and a folder without the mark (another database's run, say) is never
    touched."""
    from andrea.config import Settings
    from andrea.runs.sweep import mark_unsettled

    data = tmp_path / "d"
    with LocalClient(create_app(Settings(data_dir=data))) as c:
        deleted, kept, foreign = new_run(c), new_run(c), new_run(c)
        for run in (deleted, kept, foreign):
            train_some(c, run, 2, "stopped")
            assert put(c, run, 2, state(run)).status_code == 201
        store, ckpts = c.app.state.store, c.app.state.checkpoints
        mark_unsettled(data, deleted["id"])             # a delete, stopped after the row
        assert store.runs.delete(deleted["id"])
        mark_unsettled(data, kept["id"])                # ... stopped before the row
        mark_unsettled(data, "branch1")                 # a branch, stopped before its row
        ckpts.link(kept["id"], 2, "branch1")
        assert store.runs.delete(foreign["id"])          # (as if another database's)
    with LocalClient(create_app(Settings(data_dir=data))) as c:
        runs = data / "runs"
        assert sorted(p.name for p in runs.iterdir()) == sorted([kept["id"], foreign["id"]])
        assert not (runs / kept["id"] / "UNSETTLED").exists()
        assert steps(c, kept) == [2]
        r = c.delete(f"/api/runs/{kept['id']}", headers=headers(kept["token"]))
        assert r.status_code == 204 and not (runs / kept["id"]).exists()


def test_a_resume_drops_the_final_weights_of_the_timeline_it_abandons(client):
    """Stopped at step 10 (its tab uploaded the weights of step 10), resumed from 6: an export
    served those weights with the card of a 6-step run, while it trained again or for good."""
    run = new_run(client)
    train_some(client, run, 10, "stopped")
    assert put(client, run, 6, state(run)).status_code == 201
    w10 = np.full(run["layout"]["total_numel"], 0.5, dtype="<f4")
    assert client.put(f"/api/runs/{run['id']}/weights", content=w10.tobytes(),
                      headers=headers(run["token"])).status_code == 204
    assert client.post(f"/api/runs/{run['id']}/resume").status_code == 200
    assert client.get(f"/api/runs/{run['id']}").json()["has_weights"] is False
    assert client.get(f"/api/runs/{run['id']}/model.safetensors").status_code == 404
