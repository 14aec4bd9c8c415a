"""No request can hold a worker (the event loop and its threads: routes/data.py waits,
routes/exports.py streams), against a real server: batch requests that wait for a bandit's
training losses wait on the event loop (at most MAX_WAITING per run, a far step answered at
once), long reads (exports, the runs list, CSV) run on their own connections so another run's
trainer keeps its acks, an export never loads a whole run, and held model.safetensors downloads
leave nothing on disk."""

from __future__ import annotations

import asyncio
import json
import threading
import zipfile
from io import BytesIO
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from websockets.sync.client import connect

from andrea.app import create_app
from andrea.config import Settings
from andrea.data.run_registry import MAX_WAITING
from andrea.run_config import StoredRunConfig, run_layout
from andrea.store import Store
from tests import aio
from tests.trainer_client import bearer, hello, new_run, record, rss_mib, ws_url

# Enough connections and exports at once from this one client for the crowd below (the
# per-client caps are other tests' subject), and waiting batches that outlast a loaded machine's
# slowest steps below (the states are the subject, not the 10 s default).
SETTINGS = {"max_connections_per_client": 400, "max_exports_per_client": 8,
            "batch_wait_s": 300}


@pytest.fixture
def live(servers, tiny):
    """Starts a server on a data dir; its tokenizers and token files are the session's
    (ANDREA_CACHE_DIR), tiny's built already."""
    return lambda data_dir: servers(data_dir, **SETTINGS)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and p.name != "server.log" and "sqlite" not in p.name)


# ---- 1. batch requests that wait hold no thread ----------------------------------------------


def test_waiting_batch_requests_hold_no_worker(tmp_path, live):
    """60 requests for a bandit step whose losses are not reported: MAX_WAITING of them wait,
    the rest are told at once; /healthz and another run's batches answer meanwhile; the waiting
    ones are served once the losses arrive. A step far ahead is answered at once."""
    url = live(tmp_path / "data").url
    bandit = new_run(url, data_mode="bandit", steps=1_000_000)
    other = new_run(url)
    step = 300                                      # its phase needs the losses of ~250 steps
    assert httpx.get(f"{url}/api/runs/{other['id']}/batches/0", timeout=120).status_code == 200

    async def crowd():
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     limits=httpx.Limits(max_connections=200)) as c:
            get = f"/api/runs/{bandit['id']}/batches/"
            tasks = [asyncio.create_task(c.get(get + str(step))) for _ in range(60)]
            # Those past the waiting places are answered at once, while the others wait.
            while sum(t.done() for t in tasks) < 60 - MAX_WAITING:
                await asyncio.sleep(0.05)
            refused = [t.result() for t in tasks if t.done()]
            assert all(r.status_code == 503 and r.headers["retry-after"] == "1"
                       and "already wait for its training losses" in r.json()["detail"]
                       for r in refused), refused[0].text
            # Meanwhile the server answers everything else.
            health = await c.get("/healthz")
            batch = await c.get(f"/api/runs/{other['id']}/batches/0")
            val = await c.get(f"/api/runs/{bandit['id']}/val_batches/0")
            assert health.status_code == 200 and batch.status_code == 200, batch.text
            assert val.status_code == 200
            waiting = [t for t in tasks if not t.done()]
            assert len(waiting) == MAX_WAITING
            # A step far ahead of the reports is refused at once, however many ask.
            far = await asyncio.gather(*(c.get(get + "500000") for _ in range(60)))
            assert all(r.status_code == 503 and "too far ahead" in r.json()["detail"]
                       for r in far), far[0].text
            assert not any(t.done() for t in waiting)   # (the far ones did not wait)
            # The losses arrive: the waiting requests are served.
            await asyncio.to_thread(send_steps, url, bandit, 1, step)
            served = await asyncio.gather(*waiting)
            assert [r.status_code for r in served] == [200] * MAX_WAITING, served[0].text
            assert len({r.content for r in served}) == 1
            # And the same bytes as a request made now (nothing else was decided).
            again = await c.get(get + str(step))
            assert again.content == served[0].content
    aio.run(crowd())


def send_steps(url: str, run: dict, first: int, last: int) -> None:
    with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
        assert hello(ws, run["token"])["type"] == "welcome"
        for i in range(first, last + 1, 100):
            ws.send(json.dumps({"type": "metrics", "records": [
                {**record(s), "source_losses": {"0": 5.0}}
                for s in range(i, min(i + 100, last + 1))]}))
            assert json.loads(ws.recv(timeout=30))["type"] == "ack"


# ---- 2. long reads never stop another run's trainer ------------------------------------------

RECORDS = 200_000


def big_run(data_dir: Path) -> dict:
    """A run with weights and RECORDS records, written straight into the data dir."""
    with TestClient(create_app(Settings(data_dir=data_dir)), base_url="http://127.0.0.1") as client:
        run = new_run(client, steps=1_000_000)
        w = np.zeros(run["layout"]["total_numel"], "<f4")
        r = client.put(f"/api/runs/{run['id']}/weights", content=w.tobytes(),
                       headers=bearer(run["token"]))
        assert r.status_code == 204, r.text
    store = Store(data_dir / "andrea.sqlite")
    try:
        for first in range(1, RECORDS + 1, 2500):
            store.metrics.add(run["id"], [{**record(s), "eval_loss": 4.0 + (s % 997) / 1e3}
                                          for s in range(first, first + 2500)])
    finally:
        store.close()
    return run


def test_exports_and_lists_do_not_stop_another_trainers_acks(tmp_path, live):
    data_dir = tmp_path / "data"
    big = big_run(data_dir)
    proc, url, _ = live(data_dir)
    trainer = new_run(url, steps=1_000_000)
    base_rss = rss_mib(proc.pid)
    peak, results = [base_rss], []
    busy, pause = threading.Event(), threading.Event()

    def reader(path: str, times: int):
        with httpx.Client(base_url=url, timeout=300) as c:
            for _ in range(times):
                r = c.get(path)
                results.append((path, r.status_code, r.content))

    readers = [threading.Thread(target=reader, args=(f"/api/runs/{big['id']}/export.zip", 2))
               for _ in range(3)]
    readers += [threading.Thread(target=reader, args=("/api/runs", 20)) for _ in range(3)]
    readers += [threading.Thread(target=reader,
                                 args=(f"/api/runs/{big['id']}/metrics?format=csv", 1))]

    def watch_rss():
        while busy.is_set():
            peak.append(rss_mib(proc.pid))
            pause.wait(0.02)

    acks_during = 0
    with connect(ws_url(url, f"/ws/runs/{trainer['id']}")) as ws:
        assert hello(ws, trainer["token"])["type"] == "welcome"
        busy.set()
        watcher = threading.Thread(target=watch_rss)
        watcher.start()
        for t in readers:
            t.start()
        step = 1
        while any(t.is_alive() for t in readers):
            ws.send(json.dumps({"type": "metrics", "records": [record(step)]}))
            ack = json.loads(ws.recv(timeout=60))
            assert ack == {**ack, "type": "ack", "step": step}, ack
            acks_during += any(t.is_alive() for t in readers)
            step += 1
        busy.clear()
        watcher.join()
    # Every read answered, and right.
    assert len(results) == 3 * 2 + 3 * 20 + 1
    assert all(status == 200 for _, status, _ in results), [r[:2] for r in results]
    for path, _, body in results:
        if path.endswith("export.zip"):
            card = zipfile.ZipFile(BytesIO(body)).read("README.md").decode()
            assert f"| steps | {RECORDS:,} of 1,000,000 |" in card
            assert "| best eval loss | 4.0000 (step 997) |" in card
        elif "csv" in path:
            assert body.count(b"\n") == RECORDS + 1
    # Acks kept coming while the reads ran (not one batch per read: many).
    assert acks_during >= 20, acks_during
    # No export held the run: 200k records as dicts are ~140 MB.
    assert max(peak) - base_rss < 80, (base_rss, max(peak))
    # Nothing changed: the big run's records, and no export's files left in the data dir.
    shown = httpx.get(f"{url}/api/runs/{big['id']}").json()
    assert shown["last_step"] == RECORDS
    assert not [f for f in files_under(data_dir) if "export" in f]


# ---- 3. held downloads keep no copies --------------------------------------------------------


def test_held_weight_downloads_leave_no_copies_and_match_safetensors(tmp_path, live):
    from safetensors.numpy import save_file

    from andrea.export import tensors

    data_dir = tmp_path / "data"
    url = live(data_dir).url
    run = new_run(url)
    w = np.random.default_rng(1).standard_normal(run["layout"]["total_numel"]).astype("<f4")
    r = httpx.put(f"{url}/api/runs/{run['id']}/weights", content=w.tobytes(),
                  headers=bearer(run["token"]))
    assert r.status_code == 204, r.text
    before = files_under(data_dir)
    path = f"{url}/api/runs/{run['id']}/model.safetensors"
    with httpx.Client(timeout=60) as c:
        held = [c.stream("GET", path) for _ in range(5)]
        responses = [h.__enter__() for h in held]
        pieces = [resp.iter_bytes(4096) for resp in responses]
        firsts = [next(it) for it in pieces]
        assert files_under(data_dir) == before          # while all five are held open
        bodies = [first + b"".join(it) for first, it in zip(firsts, pieces)]
        for h in held:
            h.__exit__(None, None, None)
    assert files_under(data_dir) == before
    # The same bytes as safetensors' own writer gives for these weights (today's file).
    layout = run_layout(StoredRunConfig.model_validate(run["config"]))
    save_file(tensors(layout, w), str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    ref = (tmp_path / "ref.safetensors").read_bytes()
    assert all(b == ref for b in bodies)
    assert responses[0].headers["content-length"] == str(len(ref))
    assert 'filename="andrea-' in responses[0].headers["content-disposition"]
    # A run without weights: told so, at once.
    bare = new_run(url)
    r = httpx.get(f"{url}/api/runs/{bare['id']}/model.safetensors")
    assert r.status_code == 404 and "no saved weights" in r.json()["detail"]
