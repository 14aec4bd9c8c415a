"""What readers can cost the server (server/web/limits.py ReadBudget, routes/spikes.py,
routes/exports.py, telemetry/viewer.py), against real servers with small limits (ANDREA_*
settings) where it matters:

- GET /api/runs/{id}/spikes: one computation per (run, last step), shared by every request
  that comes meanwhile (single-flight: per run, also while a trainer moves its last step), and
  incremental: a new answer feeds only the new records and makes only the new spikes' batches;
  a resume that cuts the records back starts the detector over; answers equal a fresh
  computation's. The runs kept are bounded by their estimated bytes (spikes_cache_bytes, the
  estimate held to the measured objects), not by a count: 100 runs asked in turn are each
  computed once.
- GET /api/runs/{id}/export.zip: made as it is sent, so it works with the data dir below its
  free-space floor and no file may be written (every byte of the zip equals `andrea export`'s
  files); at most max_exports_per_client at once per address (429 with Retry-After).
- Viewer sockets: at most max_viewers_per_client per address (more closed 1008 with a clear
  message), and backlog bytes read from the store per address a burst then a rate (re-reads
  past it are paced; another address and the trainer's acks are not).

Client addresses other than 127.0.0.1 come through X-Forwarded-For, which uvicorn takes from
a loopback peer (its trusted proxy by default), as behind the README's nginx."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import sys
import threading
import time
import zipfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.cli.main import main
from andrea.routes.spikes import HEADER, Spikes, _RunSpikes, get_spikes
from andrea.spikes import RunningMedian, SpikeFinder
from andrea.web.quotas import ClientSlots, RateLimiter
from tests.servers import serve
from tests.trainer_client import (
    bearer,
    expect_close,
    fill,
    hello,
    new_run,
    record,
    rss_mib,
    ws_url,
)

# ---- helpers ---------------------------------------------------------------------------------

# Seeding a run fast: no trainer-side pacing (records per second, bytes per second).
FAST_TRAINERS = {"metrics_rate_per_s": 1e6, "metrics_bytes_per_s": 1e9,
                 "client_metrics_bytes_per_s": 1e9}


def spike_records(first: int, last: int, spikes: set[int]) -> list[dict]:
    """Records with a grad norm around 1 and, at `spikes`, 9 with row 1 far above the rest."""
    return [{**record(s), "grad_norm": 9.0 if s in spikes else 1.0 + 0.05 * (s % 5),
             "row_losses": [4.0, 11.0, 4.2, 3.9] if s in spikes else [5.0] * 4}
            for s in range(first, last + 1)]


def send(url: str, run: dict, records: list[dict], per: int = 1000) -> None:
    with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
        assert hello(ws, run["token"], records[0]["step"] - 1)["type"] == "welcome"
        for i in range(0, len(records), per):
            ws.send(json.dumps({"type": "metrics", "records": records[i:i + per]}))
            assert json.loads(ws.recv(timeout=60))["type"] == "ack"


def how(r) -> str:
    return r.headers[HEADER].split(";")[0]


def fed(r) -> dict[str, int]:
    """{records, batches} of a computed answer's header."""
    return {k: int(v) for k, v in (p.strip().split("=") for p in r.headers[HEADER].split(";")[1:])}


def files_of(data: Path) -> list[Path]:
    return sorted(p.relative_to(data) for p in data.rglob("*")
                  if p.name != "server.log" and "andrea.sqlite" not in p.name)


def viewer(url: str, run_id: str, client: str | None = None, after: int | None = None):
    headers = {"X-Forwarded-For": client} if client else None
    query = "" if after is None else f"?after={after}"
    return connect(ws_url(url, f"/ws/runs/{run_id}/watch{query}"), additional_headers=headers,
                   max_size=None)


def records_until_quiet(ws, quiet_s: float = 3.0, upto: int | None = None) -> list[int]:
    """The record steps the viewer gets until nothing comes for `quiet_s` (or step `upto`)."""
    steps = []
    while True:
        try:
            msg = json.loads(ws.recv(timeout=quiet_s))
        except TimeoutError:
            return steps
        if msg["type"] == "records":
            steps += [r["step"] for r in msg["records"]]
            if upto is not None and steps and steps[-1] >= upto:
                return steps


# ---- the budgets' arithmetic (an injected clock) ---------------------------------------------


def test_a_clients_byte_budget_goes_into_debt_and_slots_come_back():
    now = [0.0]
    reads = RateLimiter(100, 10.0, clock=lambda: now[0])
    assert reads.bucket("a").take(60) == 0                # within the burst
    assert reads.bucket("a").take(60) == pytest.approx(2.0)   # 20 in debt at 10 per second
    assert reads.bucket("b").take(60) == 0                # another address: its own budget
    now[0] += 2.0
    assert reads.bucket("a").take(0) == 0                 # the debt paid
    assert reads.bucket("a").take(50) == pytest.approx(5.0)   # no burst saved up meanwhile

    slots = ClientSlots(2)
    one, two = slots.take("a"), slots.take("a")
    assert one and two and slots.take("a") is None and slots.take("b") is not None
    one()
    one()                                                # released once, however often called
    assert slots.held["a"] == 1 and slots.take("a") is not None and slots.take("a") is None


# ---- (1) spikes: single-flight, incremental, equal to a fresh computation ---------------------


def test_concurrent_spike_requests_share_one_computation_and_later_ones_feed_only_new_records(
        client):
    made = new_run(client, batch_size=4, steps=5000)
    run_id, store = made["id"], client.app.state.store
    store.metrics.add(run_id, spike_records(1, 3000, {500, 1500, 2500}))
    path = f"/api/runs/{run_id}/spikes"

    async def at_once(n: int) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app, client=("10.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await asyncio.gather(*(c.get(path) for _ in range(n)))

    got = client.portal.call(at_once, 8)
    assert sorted(how(r) for r in got) == ["computed"] + ["shared"] * 7
    assert client.app.state.spikes.computed == 1
    first = next(r for r in got if how(r) == "computed")
    assert fed(first) == {"records": 3000, "batches": 3}
    assert all(r.status_code == 200 and r.content == first.content for r in got)
    kept = client.get(path)
    assert how(kept) == "kept" and kept.content == first.content
    spikes = first.json()["spikes"]
    assert [s["step"] for s in spikes] == [500, 1500, 2500]
    assert all(s["rows"][0]["row"] == 1 and s["rows"][0]["text"] for s in spikes)

    store.metrics.add(run_id, spike_records(3001, 3400, {3200}))
    later = client.get(path)
    assert how(later) == "computed" and fed(later) == {"records": 400, "batches": 1}
    assert [s["step"] for s in later.json()["spikes"]] == [500, 1500, 2500, 3200]
    client.app.state.spikes = None                      # forgotten: a fresh computation
    fresh = client.get(path)
    assert fed(fresh) == {"records": 3400, "batches": 4} and fresh.content == later.content


def test_a_resume_that_cuts_the_records_back_starts_the_detector_over(client):
    made = new_run(client, batch_size=4, steps=5000)
    run_id, store = made["id"], client.app.state.store
    store.metrics.add(run_id, spike_records(1, 2000, {400, 1800}))
    path = f"/api/runs/{run_id}/spikes"
    assert [s["step"] for s in client.get(path).json()["spikes"]] == [400, 1800]
    status = store.runs.get(run_id)["status"]
    assert store.runs.resume(run_id, 1000, "0" * 64, (status,)) is None    # 1001.. deleted
    store.metrics.add(run_id, spike_records(1001, 2500, {2200}))          # past the old last
    again = client.get(path)
    assert how(again) == "computed" and fed(again)["records"] == 2500     # started over
    assert [s["step"] for s in again.json()["spikes"]] == [400, 2200]
    client.app.state.spikes = None
    assert client.get(path).content == again.content


def test_a_trained_runs_spikes_are_at_most_fresh_s_behind_its_records(client):
    """While a trainer trains a run, its last step moves every few milliseconds: an answer
    younger than spikes_fresh_s is served for the later steps, so pollers make one a second,
    not one a step; once its training ended, or no trainer is at it, the answer is current."""
    made = new_run(client, batch_size=4, steps=5000)
    run_id, store = made["id"], client.app.state.store
    now = [100.0]
    client.app.state.spikes = Spikes(fresh_s=1.0, clock=lambda: now[0])
    path = f"/api/runs/{run_id}/spikes"

    def steps(r) -> list[int]:
        return [s["step"] for s in r.json()["spikes"]]
    with client.websocket_connect(f"/ws/runs/{run_id}") as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"

        def train(first, last, spikes):
            ws.send_json({"type": "metrics", "records": spike_records(first, last, spikes)})
            assert ws.receive_json() == {"type": "ack", "step": last}
        train(1, 1000, {500})
        first = client.get(path)
        assert how(first) == "computed" and steps(first) == [500]
        train(1001, 1200, {1100})
        now[0] += 0.9
        stale = client.get(path)
        assert how(stale) == "kept" and stale.content == first.content     # 0.9 s behind
        now[0] += 0.2
        fresh = client.get(path)
        assert how(fresh) == "computed" and fed(fresh)["records"] == 200
        assert steps(fresh) == [500, 1100]
        train(1201, 1300, {1250})
        ws.send_json({"type": "status", "status": "finished"})
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}
        ended = client.get(path)                        # at once: its training ended
        assert how(ended) == "computed" and steps(ended) == [500, 1100, 1250]
    store.metrics.add(run_id, spike_records(1301, 1400, {1350}))   # (no trainer at it)
    assert steps(client.get(path)) == [500, 1100, 1250, 1350]
    assert client.app.state.spikes.computed == 4


def test_spike_pollers_on_a_real_server_compute_once_per_step(servers, tmp_path):
    data = tmp_path / "spikes"
    earlier = servers(data, spikes_fresh_s=0, **FAST_TRAINERS)   # each step's answer current
    url = earlier.url
    run = new_run(url, batch_size=4, steps=20_000)
    spikes = set(range(250, 10_001, 500))
    send(url, run, spike_records(1, 10_000, spikes))
    path = f"{url}/api/runs/{run['id']}/spikes"
    start = threading.Barrier(10)

    def poll(_):
        start.wait()
        return httpx.get(path, timeout=120)

    with ThreadPoolExecutor(10) as pool:
        got = list(pool.map(poll, range(10)))
    assert [how(r) for r in got].count("computed") == 1, [how(r) for r in got]
    assert all(r.status_code == 200 and r.content == got[0].content for r in got)
    assert fed(next(r for r in got if how(r) == "computed")) == {"records": 10_000,
                                                                 "batches": len(spikes)}
    send(url, run, spike_records(10_001, 11_000, {10_250, 10_750}))
    later = httpx.get(path, timeout=120)
    assert fed(later) == {"records": 1000, "batches": 2}
    earlier.stop()
    url = servers(data).url                              # a fresh process: nothing kept
    fresh = httpx.get(f"{url}/api/runs/{run['id']}/spikes", timeout=120)
    assert fed(fresh) == {"records": 11_000, "batches": len(spikes) + 2}
    assert fresh.json() == later.json()


# ---- (1b) spikes: kept by memory, single-flight per run -------------------------------------


def kept_bytes(state) -> int:
    """What a kept run's state really holds, measured: every object reachable from it (each
    once; the detector's and the route's objects followed, the lock's loop not)."""
    seen, stack, total = set(), [state], 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, asyncio.Lock):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack += [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, deque)):
            stack += list(o)
        elif isinstance(o, (_RunSpikes, SpikeFinder, RunningMedian)):
            stack.append(vars(o))
    return total


def quiet(records: list[dict]) -> list[dict]:
    """Records without per-row losses: spikes with no rows to describe (no batches made)."""
    return [{k: v for k, v in r.items() if k != "row_losses"} for r in records]


def runs_of_one_config(client, more: list[str]) -> list[str]:
    """A run made through the app (tiny, batch 4, 1000 steps) and the runs `more` made in its
    store with its config: their ids, the app's first."""
    made = new_run(client, batch_size=4, steps=1000)
    store = client.app.state.store
    config = store.runs.get(made["id"])["config"]
    for run_id in more:
        store.runs.create(run_id, config, "0" * 64)
    return [made["id"], *more]


def test_cycling_through_100_runs_computes_each_once_and_keeps_them_within_the_budget(client):
    """Before: 64 runs were kept by count, so a client asking 100 runs in turn made every
    answer again (200 computations for two rounds); now the runs kept are bounded by their
    estimated bytes (spikes_cache_bytes), which 100 ordinary runs fit."""
    store = client.app.state.store
    ids = runs_of_one_config(client, [f"cycle{i:03d}" for i in range(99)])
    for i, run_id in enumerate(ids):
        store.metrics.add(run_id, quiet(spike_records(1, 60, {20 + i % 30, 55})))
    for round_ in range(2):
        for run_id in ids:
            r = client.get(f"/api/runs/{run_id}/spikes")
            assert r.status_code == 200 and how(r) == ("computed", "kept")[round_], round_
    cache = client.app.state.spikes
    assert cache.computed == 100 and len(cache.runs) == 100
    assert cache.budget == client.app.state.settings.spikes_cache_bytes
    assert cache.size == sum(s.estimate() for s in cache.runs.values()) <= cache.budget
    assert sum(kept_bytes(s) for s in cache.runs.values()) <= cache.size


def test_a_small_spike_budget_keeps_the_runs_last_asked_and_never_more_than_it(client):
    """A budget of about 8 ordinary runs: cycling through 20 makes each again (the least
    recently asked went first), what is kept is never over the budget, measured, and the
    runs asked last are kept."""
    store = client.app.state.store
    ids = runs_of_one_config(client, [f"small{i:02d}" for i in range(19)])
    for run_id in ids:
        store.metrics.add(run_id, quiet(spike_records(1, 200, {30, 90, 150})))
    client.get(f"/api/runs/{ids[0]}/spikes")
    one = client.app.state.spikes.runs[ids[0]].estimate()
    cache = client.app.state.spikes = Spikes(fresh_s=0, budget_bytes=8 * one + one // 2)
    for round_ in range(2):
        for run_id in ids:
            r = client.get(f"/api/runs/{run_id}/spikes")
            assert how(r) == "computed"
            assert cache.size <= cache.budget
            assert sum(kept_bytes(s) for s in cache.runs.values()) <= cache.budget
    assert cache.computed == 40 and list(cache.runs) == ids[-8:]
    assert how(client.get(f"/api/runs/{ids[-1]}/spikes")) == "kept"
    assert how(client.get(f"/api/runs/{ids[-8]}/spikes")) == "kept"
    cache.budget = one // 2                     # a run alone over the budget is not kept
    store.metrics.add(ids[0], quiet(spike_records(201, 210, set())))
    assert how(client.get(f"/api/runs/{ids[0]}/spikes")) == "computed"
    assert cache.size <= cache.budget and ids[0] not in cache.runs


@pytest.mark.parametrize("shape", ["bare", "rows", "non-finite", "anatomy", "phases"])
def test_a_kept_runs_estimate_is_at_least_what_it_holds(client, shape):
    """The estimate the budget counts (_RunSpikes.estimate) is at least the bytes measured
    of what is kept, and not far above them, for records of every shape: with per-row
    losses (rows described, their text kept), a NaN every step, per-tensor norms and
    non-finite counts, a bandit's phase changes."""
    made = new_run(client, batch_size=4, steps=2000)
    run_id, store = made["id"], client.app.state.store
    n_tensors = len(made["layout"]["params"])
    records = spike_records(1, 1200, set(range(100, 1201, 25)))
    for r in records:
        if shape != "rows":
            r.pop("row_losses")
        if shape == "non-finite":
            r["grad_norm"] = None
        if shape == "anatomy":
            spike = r["grad_norm"] > 5
            r.update(logit_max=10.0 + r["step"] % 7, softmax_denom_min=1.5,
                     tensor_grad_norms=[0.1 + i / 100 for i in range(n_tensors)],
                     grad_nonfinite=2 if spike else 0,
                     tensor_nonfinite=[int(spike and i < 2) for i in range(n_tensors)])
        if shape == "phases":
            r["phase"] = r["step"] // 3
    store.metrics.add(run_id, records)
    assert client.get(f"/api/runs/{run_id}/spikes").status_code == 200
    state = client.app.state.spikes.runs[run_id]
    assert len(state.finder.spikes) > 40
    measured = kept_bytes(state)
    assert measured <= state.estimate() <= 2 * measured, (measured, state.estimate())


def test_concurrent_requests_for_a_run_being_trained_share_one_computation(client):
    """While a trainer trains a run its last step moves between requests: before, each last
    step began its own computation (8 requests, 8 computations of the same run, one after
    another); now a request shares the run's answer being made where that is current for it
    (begun less than spikes_fresh_s ago), and only there: with no trainer at the run, a
    request for a later step than the answer being made begins the next one."""
    made = new_run(client, batch_size=4, steps=5000)
    run_id, store, app = made["id"], client.app.state.store, client.app
    store.metrics.add(run_id, quiet(spike_records(1, 1100, {500, 1050})))
    run = store.runs.get(run_id)
    assert run["status"] not in ("finished", "stopped", "failed", "interrupted")
    now = [100.0]
    app.state.spikes = Spikes(fresh_s=1.0, clock=lambda: now[0])

    def ask(last: int, trainer: bool):
        """The route, as a request for the run at `last` would call it (a task: it runs to
        its first wait when the caller next waits)."""
        return asyncio.ensure_future(get_spikes(
            SimpleNamespace(app=app), {**run, "last_step": last}, store, app.state.data,
            app.state.runs, app.state.settings, SimpleNamespace(has_trainer=lambda _: trainer)))

    async def at_once(lasts: list[int], trainer: bool):
        return await asyncio.gather(*[ask(last, trainer) for last in lasts])

    got = client.portal.call(at_once, list(range(1000, 1008)), True)
    assert sorted(r.headers[HEADER].split(";")[0] for r in got) == ["computed"] + ["shared"] * 7
    assert app.state.spikes.computed == 1 and len({r.body for r in got}) == 1
    assert [s["step"] for s in json.loads(got[0].body)["spikes"]] == [500, 1050]

    app.state.spikes = Spikes(fresh_s=1.0, clock=lambda: now[0])
    older, later = client.portal.call(at_once, [1000, 1100], False)
    assert [r.headers[HEADER].split(";")[0] for r in (older, later)] == ["computed"] * 2
    assert app.state.spikes.computed == 2 and app.state.spikes.runs[run_id].answer[0] == 1100


# ---- (2) export.zip: streamed, nothing on disk; per-client concurrency -------------------------

BIG = {"preset": "tiny", "n_embd": 384, "n_layer": 6, "n_head": 6, "ffn_dim": 1024,
       "steps": 100}                                    # 41 MiB of weights: more than buffers


@pytest.fixture(scope="module")
def floor_server(tmp_path_factory):
    """A run with 41 MiB of weights, a tokenizer and three records, served by a server whose
    data dir is below its free-space floor and whose process may write no file past 1 MiB."""
    data = tmp_path_factory.mktemp("floor")
    with serve(data) as s:
        url = s.url
        run = new_run(url, **BIG)
        weights = np.random.default_rng(0).standard_normal(run["layout"]["total_numel"],
                                                           dtype=np.float32)
        r = httpx.put(f"{url}/api/runs/{run['id']}/weights", content=weights.tobytes(),
                      headers=bearer(run["token"]), timeout=120)
        assert r.status_code == 204, r.text
        assert httpx.get(f"{url}/api/runs/{run['id']}/batches/0",
                         timeout=120).status_code == 200       # the tokenizer is built
        fill(url, run, 1, 3)
    with serve(data, file_limit=1 << 20, min_free_bytes=1 << 60, max_exports_per_client=2) as s:
        yield s.proc, s.url, data, run


def test_an_export_zip_streams_below_the_disk_floor_and_writes_nothing(floor_server, tmp_path):
    """Before: the export and then its zip were written into the data dir first (8 slow
    readers of a real server got six 500s "No space left")."""
    proc, url, data, run = floor_server
    before = files_of(data)
    r = httpx.get(f"{url}/api/runs/{run['id']}/export.zip", timeout=120)
    assert r.status_code == 200, r.text
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.headers["content-disposition"] == f'attachment; filename="andrea-{run["id"]}.zip"'
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        assert zf.testzip() is None
        assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in zf.infolist())
        zipped = {i.filename: zf.read(i) for i in zf.infolist()}
    out = tmp_path / "local"
    assert main(["export", run["id"], "--out", str(out), "--data-dir", str(data)]) == 0
    local = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert "tokenizer.json" in local and "model.safetensors" in local
    assert zipped == local                              # byte for byte, every file
    assert files_of(data) == before                     # no temporary folder, no zip
    assert httpx.get(f"{url}/api/runs/{run['id']}/export.zip", timeout=120).content == r.content


def held_export(url: str, run_id: str) -> socket.socket:
    """An export.zip request whose reader takes the response head and then nothing more."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    s.sendall(f"GET /api/runs/{run_id}/export.zip HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
              .encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1024)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s


def test_exports_past_the_clients_cap_get_429_and_hold_bounded_memory(floor_server):
    proc, url, _, run = floor_server
    path = f"{url}/api/runs/{run['id']}/export.zip"
    other = {"X-Forwarded-For": "10.0.0.9"}
    assert httpx.get(path, headers=other, timeout=120).status_code == 200   # (warm)
    base = rss_mib(proc.pid)
    held = [held_export(url, run["id"]) for _ in range(2)]
    try:
        time.sleep(1)                   # their zips' threads run ahead until they block
        grown = rss_mib(proc.pid) - base
        weights_mib = 4 * run["layout"]["total_numel"] / (1 << 20)
        assert grown < weights_mib / 2, f"two held exports: +{grown:.0f} MiB"
        r = httpx.get(path, timeout=30)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "5"
        assert "too many exports at once from 127.0.0.1: 2 at a time" in r.json()["detail"]
        assert "ANDREA_MAX_EXPORTS_PER_CLIENT" in r.json()["detail"]
        assert httpx.get(path, headers=other, timeout=120).status_code == 200  # another address
    finally:
        held.pop().close()
    try:
        deadline = time.monotonic() + 30
        while (status := httpx.get(path, timeout=120).status_code) == 429:
            assert time.monotonic() < deadline, "the closed reader's slot never came back"
            time.sleep(0.2)
        assert status == 200
    finally:
        for s in held:
            s.close()


# ---- (3) viewers: sockets per address, backlog bytes per address ------------------------------


def test_a_viewer_flood_from_one_address_is_refused_with_1008_past_the_cap(servers):
    """Before: 60 viewers that never read, from one address, each held a socket and its
    buffers (a victim trainer's ack p99 went to 1.8-3.4 s)."""
    url = servers(max_viewers_per_client=4).url
    run = new_run(url, steps=100)
    fill(url, run, 1, 10)
    with contextlib.ExitStack() as kept:
        first = kept.enter_context(viewer(url, run["id"]))
        for ws in [first] + [kept.enter_context(viewer(url, run["id"])) for _ in range(3)]:
            assert json.loads(ws.recv(timeout=10))["type"] == "run"
        for _ in range(20):
            with viewer(url, run["id"]) as ws:
                text = expect_close(ws, 1008)
            assert text.startswith("too many viewer sockets from 127.0.0.1: 4 at once")
            assert "ANDREA_MAX_VIEWERS_PER_CLIENT" in text
        with viewer(url, run["id"], client="10.0.0.2") as ws:            # another address
            assert json.loads(ws.recv(timeout=10))["type"] == "run"
        with connect(ws_url(url, f"/ws/runs/{run['id']}")) as trainer:   # trainers: unaffected
            assert hello(trainer, run["token"], 10)["type"] == "welcome"
            trainer.send(json.dumps({"type": "metrics", "records": [record(11)]}))
            assert json.loads(trainer.recv(timeout=10)) == {"type": "ack", "step": 11}
        first.close()
        deadline = time.monotonic() + 15
        while True:                     # the closed socket's slot comes back
            with viewer(url, run["id"]) as ws:
                said = json.loads(ws.recv(timeout=10))
            if said["type"] == "run":
                break
            assert time.monotonic() < deadline, said
            time.sleep(0.2)


def test_backlog_rereads_past_the_clients_budget_are_paced(servers):
    """Before: 20 viewers re-reading a run from step -1 in a loop took a victim trainer's ack
    p99 to seconds. Here an address's budget is 1 MiB and then 1 KiB/s: the first read of the
    backlog (~0.7 MB) is whole, a re-read gets what is left of the burst and then waits; other
    addresses and the trainer's acks are not held back."""
    url = servers(viewer_backlog_burst_bytes=1 << 20, viewer_backlog_bytes_per_s=1024,
                    **FAST_TRAINERS).url
    run = new_run(url, steps=10_000)
    fill(url, run, 1, 5000)
    with viewer(url, run["id"], client="10.0.0.1") as ws:
        assert records_until_quiet(ws, upto=5000) == list(range(1, 5001))   # within the burst
        ws.send(json.dumps({"type": "from", "step": -1}))
        again = records_until_quiet(ws)
        assert 0 < len(again) < 5000 and again == list(range(1, len(again) + 1))
        ws.send(json.dumps({"type": "ping"}))      # paced, not stuck: its reader still answers
        assert json.loads(ws.recv(timeout=10)) == {"type": "pong"}
        with viewer(url, run["id"], client="10.0.0.1") as same:   # one budget per address
            assert json.loads(same.recv(timeout=10))["type"] == "run"
            assert len(records_until_quiet(same)) <= 512     # a page or two, then it waits
        with viewer(url, run["id"], client="10.0.0.2") as other:
            assert json.loads(other.recv(timeout=10))["type"] == "run"
            assert records_until_quiet(other, upto=5000) == list(range(1, 5001))
        with connect(ws_url(url, f"/ws/runs/{run['id']}")) as trainer:
            assert hello(trainer, run["token"], 5000)["type"] == "welcome"
            trainer.send(json.dumps({"type": "metrics", "records": [record(5001)]}))
            assert json.loads(trainer.recv(timeout=10)) == {"type": "ack", "step": 5001}


def test_a_paced_viewer_that_leaves_frees_its_socket(servers):
    """A viewer waiting for its address's budget holds nothing once it goes: its slot is
    back for the next one."""
    url = servers(viewer_backlog_burst_bytes=64 << 10, viewer_backlog_bytes_per_s=1024,
                    max_viewers_per_client=1).url
    run = new_run(url, steps=5000)
    fill(url, run, 1, 3000)
    with viewer(url, run["id"]) as ws:
        assert 0 < len(records_until_quiet(ws, quiet_s=2)) < 3000    # paced
    deadline = time.monotonic() + 15
    while True:
        try:
            with viewer(url, run["id"]) as ws:
                if json.loads(ws.recv(timeout=10))["type"] == "run":
                    break
        except ConnectionClosed:
            pass
        assert time.monotonic() < deadline, "the paced viewer's slot never came back"
        time.sleep(0.2)


def test_a_run_of_spikes_everywhere_lists_its_newest_and_says_how_many_were_left_out(
        client, monkeypatch):
    """A non-finite grad norm is a spike at every step: the answer (and what is kept of the
    run) stops at the newest MAX_SPIKES."""
    from andrea.routes import spikes as route

    monkeypatch.setattr(route, "MAX_SPIKES", 3)
    made = new_run(client, batch_size=4, steps=100)
    run_id, store = made["id"], client.app.state.store
    store.metrics.add(run_id, [{**r, "grad_norm": None} for r in spike_records(1, 8, set())])
    path = f"/api/runs/{run_id}/spikes"
    got = client.get(path).json()
    assert [s["step"] for s in got["spikes"]] == [6, 7, 8] and got["omitted"] == 5
    store.metrics.add(run_id, [{**r, "grad_norm": None} for r in spike_records(9, 10, set())])
    later = client.get(path)
    assert fed(later)["records"] == 2
    assert [s["step"] for s in later.json()["spikes"]] == [8, 9, 10]
    assert later.json()["omitted"] == 7
    client.app.state.spikes = None
    assert client.get(path).content == later.content


# ---- JSON reads: a budget per client address ---------------------------------------------------


def test_json_reads_are_budgeted_per_client_address(servers):
    """Before: 10 clients polling the spike list took ~1,600 answers a second of 240 KB and the
    victim's acks waited behind them. A read costs its bytes plus 128 KiB; at a budget of
    1 KiB/s (a 1 KiB burst) one read puts its address ~2 min in debt: the next is answered 429
    with Retry-After, while other addresses, the trainer's batches and pages are not held."""
    url = servers(read_bytes_per_s=1024).url
    run = new_run(url, steps=50)
    with httpx.Client(base_url=url, timeout=60) as poller:
        assert poller.get(f"/api/runs/{run['id']}/spikes").status_code == 200   # no debt yet
        r = poller.get(f"/api/runs/{run['id']}/spikes")
        assert r.status_code == 429, r.text
        assert "ANDREA_READ_BYTES_PER_S" in r.json()["detail"]
        assert int(r.headers["retry-after"]) >= 1
        assert poller.get("/api/runs").status_code == 429              # every JSON read
        # Not delayed: the trainer's batches, pages, health.
        batch = poller.get(f"/api/runs/{run['id']}/batches/1")
        assert batch.status_code == 200 and batch.headers["content-type"] != "application/json"
        assert poller.get("/healthz").status_code == 200
        assert poller.get(f"/runs/{run['id']}").status_code == 200
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=url, timeout=60, transport=other) as neighbour:
        assert neighbour.get("/api/runs").status_code == 200           # its own budget
