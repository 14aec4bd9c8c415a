"""Can one participant stall everyone? (issue 23, item 3) Latencies a real trainer sees, alone and
beside hostile loops, against a real `andrea serve`:

  /healthz and a trainer's batch fetch, p50/p99: alone, then with 60 looping requests for a far
  step of a bandit run (each used to hold a worker thread for the bandit's 10 s wait);
  a trainer's ack, p50/p99: alone, then with 8 looping GET /api/runs and 3 looping export.zip
  of a run of RECORDS records (written straight into the store before the server starts);
  and the server's peak RSS meanwhile.

    .venv/bin/python -m bench.hostile_workers [--records 1000000] [--cache DATA_DIR]

--cache: a data dir whose tokenizers/ and tokens/ are copied first (else the server builds them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from websockets.sync.client import connect

from andrea.cli.launch import start_server, stop_server
from andrea.store import Store
from tests.trainer_client import rss_mib

ENV = {"ANDREA_MAX_CONNECTIONS_PER_CLIENT": "400", "ANDREA_METRICS_RATE_PER_S": "1000000"}


def pct(xs: list[float]) -> str:
    a = np.array(xs) * 1000
    return f"p50 {np.percentile(a, 50):8.1f} ms  p99 {np.percentile(a, 99):8.1f} ms  (n={len(a)})"


def record(step: int) -> dict:
    return {"step": step, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
            "tokens_per_s": 100.0, "step_ms": 12.0, "eval_loss": 4.0 + (step % 997) / 1e3}


def big_run(data_dir: Path, records: int) -> str:
    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings

    with TestClient(create_app(Settings(data_dir=data_dir)), base_url="http://127.0.0.1",
                    client=("127.0.0.1", 50000)) as c:
        run = c.post("/api/runs", json={"preset": "tiny", "steps": 1_000_000}).json()
        w = np.zeros(run["layout"]["total_numel"], "<f4")
        c.put(f"/api/runs/{run['id']}/weights", content=w.tobytes(),
              headers={"authorization": f"Bearer {run['token']}"})
    store = Store(data_dir / "andrea.sqlite")
    t0 = time.perf_counter()
    for first in range(1, records + 1, 2500):
        store.metrics.add(run["id"], [record(s) for s in range(first,
                                                                min(first + 2500, records + 1))])
    store.close()
    print(f"{records:,} records written in {time.perf_counter() - t0:.1f} s")
    return run["id"]


def timed_gets(url: str, paths: list[str], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p: [] for p in paths}
    with httpx.Client(base_url=url, timeout=120) as c:
        for _ in range(n):
            for p in paths:
                t0 = time.perf_counter()
                r = c.get(p)
                out[p].append(time.perf_counter() - t0)
                assert r.status_code == 200, (p, r.status_code, r.text[:200])
    return out


class Loops:
    """Threads that repeat a GET until stopped; counts answers by status."""

    def __init__(self, url: str, path: str, n: int):
        self.stop, self.counts = threading.Event(), {}
        self.threads = [threading.Thread(target=self._loop, args=(url, path), daemon=True)
                        for _ in range(n)]

    def _loop(self, url: str, path: str):
        with httpx.Client(base_url=url, timeout=300) as c:
            while not self.stop.is_set():
                try:
                    s = c.get(path).status_code
                except httpx.HTTPError as e:
                    s = type(e).__name__
                self.counts[s] = self.counts.get(s, 0) + 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


async def far_crowd(url: str, path: str, n: int, stop: asyncio.Event, counts: dict):
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 limits=httpx.Limits(max_connections=n + 10)) as c:
        async def one():
            while not stop.is_set():
                s = (await c.get(path)).status_code
                counts[s] = counts.get(s, 0) + 1
        await asyncio.gather(*(one() for _ in range(n)))


def with_far_crowd(url: str, path: str, n: int, work):
    counts: dict = {}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    t = threading.Thread(target=lambda: loop.run_until_complete(
        far_crowd(url, path, n, stop, counts)), daemon=True)
    t.start()
    time.sleep(1.0)
    try:
        return work(), counts
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(timeout=90)


def acks(url: str, run: dict, first: int, n: int) -> list[float]:
    out = []
    with connect(url.replace("http://", "ws://") + f"/ws/runs/{run['id']}") as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"], "last_acked_step": None}))
        assert json.loads(ws.recv(timeout=30))["type"] == "welcome"
        for s in range(first, first + n):
            t0 = time.perf_counter()
            ws.send(json.dumps({"type": "metrics", "records": [record(s)]}))
            assert json.loads(ws.recv(timeout=120))["type"] == "ack"
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--samples", type=int, default=100)
    a = ap.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="andrea-bench-workers-")) / "data"
    data_dir.mkdir(parents=True)
    if a.cache:
        for sub in ("tokenizers", "tokens"):
            shutil.copytree(a.cache / sub, data_dir / sub)
    big = big_run(data_dir, a.records)
    proc, url = start_server(data_dir, env=ENV, timeout=300)
    peak = [rss_mib(proc.pid)]
    watching = threading.Event()
    watching.set()

    def watch():
        while watching.is_set():
            peak.append(rss_mib(proc.pid))
            time.sleep(0.05)
    threading.Thread(target=watch, daemon=True).start()
    try:
        new = lambda **cfg: httpx.post(url + "/api/runs", json={"preset": "tiny", **cfg},  # noqa: E731
                                       timeout=60).json()
        trainer, bandit = new(steps=1_000_000), new(data_mode="bandit", steps=1_000_000)
        batch = f"/api/runs/{trainer['id']}/batches/"
        timed_gets(url, ["/healthz", batch + "0"], 3)           # the corpus warm
        paths = ["/healthz", batch + "1"]
        print(f"server RSS at start: {peak[-1]:.0f} MiB")
        alone = timed_gets(url, paths, a.samples)
        far = f"/api/runs/{bandit['id']}/batches/500000"
        crowd, counts = with_far_crowd(url, far, 60, lambda: timed_gets(url, paths, a.samples))
        for p, label in zip(paths, ["/healthz", "trainer batch"]):
            print(f"{label:14s} alone:                  {pct(alone[p])}")
            print(f"{label:14s} + 60 far-step loops:    {pct(crowd[p])}")
        print(f"  the far-step loops' answers: {counts}")
        quiet = acks(url, trainer, 1, a.samples)
        print(f"ack alone:                              {pct(quiet)}")
        lists = Loops(url, "/api/runs", 8)
        exports = Loops(url, f"/api/runs/{big}/export.zip", 3)
        before = max(peak)
        with lists, exports:
            time.sleep(0.5)
            busy = acks(url, trainer, 1 + a.samples, a.samples)
        print(f"ack + 8 list loops + 3 export loops:    {pct(busy)}")
        print(f"  the list loops' answers: {lists.counts}; the export loops': {exports.counts}")
        print(f"server peak RSS: {max(peak):.0f} MiB (before the exports {before:.0f} MiB; "
              f"{a.records:,} records)")
    finally:
        watching.clear()
        stop_server(proc)
        shutil.rmtree(data_dir.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
