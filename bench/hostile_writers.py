"""Can one participant's writes or reads slow everyone else down? (issue 32) A victim trainer's
ack latency, alone and beside each attack, against one real `andrea serve` with its default
bounds (only the free-space floor is set, to make a small disk: --disk MiB above the floor):

  disk fill        3 runs streaming records with per-row losses and per-tensor norms as fast
                   as they are acked, until the server's storage budget stops them
  largest messages 3 runs sending metrics messages as big as allowed (~240 KB of ~10 KB records;
                   before the 256 KiB bound, ~1 MiB)
  status flood     3 runs sending status messages back to back
  spike pollers    10 clients polling /spikes of a run of --records records whose last step
                   moves (its trainer sends a record every 0.1 s)
  export readers   8 clients reading export.zip a few KB at a time
  viewer re-reads  20 viewers of that run asking for its whole backlog again and again
  idle viewers     60 viewers of that run that never read

The victim trains from its own address (127.0.0.2), the attackers from 127.0.0.1, as two
laptops of a class. Each attack runs in its own process (the victim's timings share no GIL
with it), starts 1 s
before the victim's samples and stops after them. Figures, not verdicts: p50 and p99 per phase
and p99's ratio to alone, with what the attackers were answered.

    .venv/bin/python -m bench.hostile_writers [--samples 300] [--records 200000] [--disk 300]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.cli.launch import start_server, stop_server
from andrea.store import Store
from bench.hostile_workers import record

ADMIN = "bench-operator-token"
VICTIM = "127.0.0.2"    # the victim's address; every attacker's is 127.0.0.1


def ws(url: str, run_id: str, watch: str = "") -> str:
    return url.replace("http://", "ws://") + f"/ws/runs/{run_id}{watch}"


def new_run(url: str, **cfg) -> dict:
    r = httpx.post(url + "/api/runs", json={"preset": "tiny", **cfg}, timeout=60,
                   headers={"authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return r.json()


def _from(url: str, address: str) -> socket.socket:
    """A connection to the server from `address` (any 127.x.y.z is this machine)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    s.bind((address, 0))
    s.connect((host, int(port)))
    return s


@contextmanager
def trainer(url: str, run: dict, address: str = "127.0.0.1"):
    """The run's trainer socket from `address`, past its hello."""
    with connect(ws(url, run["id"]), max_size=None, open_timeout=30,
                 sock=_from(url, address)) as sock:
        sock.send(json.dumps({"type": "hello", "token": run["token"], "last_acked_step": None}))
        assert json.loads(sock.recv(timeout=30))["type"] == "welcome"
        yield sock


def fat_record(step: int, batch: int, tensors: int) -> dict:
    """~10 KB as JSON at batch 1024: a loss per row, a norm and a count per tensor."""
    return {**record(step), "row_losses": [5.0 + (i % 97) / 1e3 for i in range(batch)],
            "tensor_grad_norms": [0.1 + i / 1e4 for i in range(tensors)],
            "grad_nonfinite": 0}


def victim_acks(url: str, run: dict, first: int, n: int) -> list[float]:
    """The victim: another participant (its own address, VICTIM), one record a message."""
    out = []
    with trainer(url, run, VICTIM) as t:
        for s in range(first, first + n):
            t0 = time.perf_counter()
            t.send(json.dumps({"type": "metrics", "records": [record(s)]}))
            while json.loads(t.recv(timeout=120))["type"] != "ack":
                pass
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)
    return out


# ---- the attacks: each `attack(url, ctx, stop, counts)` runs in a process until stop is set ----


def _closed(counts, e: ConnectionClosed) -> None:
    rcvd = e.rcvd
    counts[f"closed {rcvd.code if rcvd else '?'} {(rcvd.reason if rcvd else '')[:40]}"] += 1


def _stream(url: str, run: dict, stop, counts, message) -> None:
    """Sends message(step) as fast as it is acked, until stopped or closed."""
    try:
        with trainer(url, run) as t:
            step = 1
            while not stop.is_set():
                msg, n = message(step)
                t.send(msg)
                while (answer := json.loads(t.recv(timeout=120)))["type"] not in ("ack", "pong"):
                    counts[answer["type"]] += 1
                counts["acked"] += 1
                step += n
    except ConnectionClosed as e:
        _closed(counts, e)


def disk_fill(url, ctx, stop, counts):
    runs, batch, tensors = ctx["fill_runs"], ctx["batch"], ctx["tensors"]

    def message(step):
        recs = [fat_record(s, batch, tensors) for s in range(step, step + 25)]
        return json.dumps({"type": "metrics", "records": recs}), 25
    threads = [threading.Thread(target=_stream, args=(url, r, stop, counts, message))
               for r in runs]
    [t.start() for t in threads]
    [t.join() for t in threads]


def big_messages(url, ctx, stop, counts):
    runs, batch, tensors = ctx["big_runs"], ctx["batch"], ctx["tensors"]

    def message(step):
        recs = [fat_record(s % 900_000 + 1, batch, tensors) for s in range(step, step + 25)]
        return json.dumps({"type": "metrics", "records": recs}), 25   # ~240 KB: the most allowed
    threads = [threading.Thread(target=_stream, args=(url, r, stop, counts, message))
               for r in runs]
    [t.start() for t in threads]
    [t.join() for t in threads]


def status_flood(url, ctx, stop, counts):
    def flood(run):
        try:
            with trainer(url, run) as t:
                i = 0
                while not stop.is_set():
                    t.send(json.dumps({"type": "status", "status": ("running", "paused")[i % 2],
                                       "message": "x" * 1900}))
                    t.send(json.dumps({"type": "ping"}))
                    while json.loads(t.recv(timeout=120))["type"] != "pong":
                        pass
                    counts["status"] += 1
                    i += 1
        except ConnectionClosed as e:
            _closed(counts, e)
    threads = [threading.Thread(target=flood, args=(r,)) for r in ctx["status_runs"]]
    [t.start() for t in threads]
    [t.join() for t in threads]


def _moving(url, run, first, stop):
    """The big run's trainer: a record every 0.1 s, so its last step moves."""
    with trainer(url, run) as t:
        s = first
        while not stop.is_set():
            t.send(json.dumps({"type": "metrics", "records": [record(s)]}))
            t.recv(timeout=120)
            s += 1
            time.sleep(0.1)


def spike_pollers(url, ctx, stop, counts):
    big = ctx["big"]
    mover = threading.Thread(target=_moving, args=(url, big, ctx["records"] + 1, stop))
    mover.start()

    def poll():
        with httpx.Client(base_url=url, timeout=120) as c:
            while not stop.is_set():
                r = c.get(f"/api/runs/{big['id']}/spikes")
                how = r.headers.get("x-andrea-spikes", "").split(";")[0]
                counts[f"{r.status_code} {how}".strip()] += 1
    threads = [threading.Thread(target=poll) for _ in range(10)]
    [t.start() for t in threads]
    [t.join() for t in threads + [mover]]


def export_readers(url, ctx, stop, counts):
    def read():
        while not stop.is_set():
            try:
                with httpx.stream("GET", f"{url}/api/runs/{ctx['big']['id']}/export.zip",
                                  timeout=120) as r:
                    counts[r.status_code] += 1
                    for _ in r.iter_raw(4096):
                        if stop.is_set():
                            break
                        time.sleep(0.5)
            except httpx.HTTPError as e:
                counts[type(e).__name__] += 1
    threads = [threading.Thread(target=read) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]


def viewer_rereads(url, ctx, stop, counts):
    def view():
        try:
            with connect(ws(url, ctx["big"]["id"], "/watch"), max_size=None) as v:
                while not stop.is_set():
                    v.send(json.dumps({"type": "from", "step": -1}))
                    for _ in range(20):
                        v.recv(timeout=60)
                        counts["messages"] += 1
        except (ConnectionClosed, TimeoutError) as e:
            if isinstance(e, ConnectionClosed):
                _closed(counts, e)
            else:
                counts["timeout"] += 1
    threads = [threading.Thread(target=view) for _ in range(20)]
    [t.start() for t in threads]
    [t.join() for t in threads]


def idle_viewers(url, ctx, stop, counts):
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(60):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.connect((host, int(port)))
            v = connect(ws(url, ctx["big"]["id"], "/watch"), sock=s, max_size=None)
            socks.append(v)
            counts["open"] += 1
        except Exception as e:  # refused past a cap: counted
            counts[type(e).__name__] += 1
    stop.wait()
    for v in socks:
        try:
            v.socket.close()
        except OSError:
            pass


ATTACKS = [("disk fill", disk_fill), ("largest messages", big_messages),
           ("status flood", status_flood), ("spike pollers", spike_pollers),
           ("export readers", export_readers), ("viewer re-reads", viewer_rereads),
           ("idle viewers", idle_viewers)]


def _attack_main(fn, url, ctx, stop, out):
    counts = Counter()
    fn(url, ctx, stop, counts)
    out.put(dict(counts))


def seed_big_run(data_dir: Path, records: int) -> dict:
    """A run with weights and `records` records (a spike every 500 steps), written straight
    into the data dir before the server starts."""
    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings

    with TestClient(create_app(Settings(data_dir=data_dir, admin_token=ADMIN))) as c:
        run = c.post("/api/runs", json={"preset": "tiny", "steps": 1_000_000}).json()
        w = np.zeros(run["layout"]["total_numel"], "<f4")
        c.put(f"/api/runs/{run['id']}/weights", content=w.tobytes(),
              headers={"authorization": f"Bearer {run['token']}"})
    store = Store(data_dir / "andrea.sqlite")
    for first in range(1, records + 1, 2500):
        store.metrics.add(run["id"], [{**record(s), "grad_norm": 8.0 if s % 500 == 0 else 1.0}
                                      for s in range(first, min(first + 2500, records + 1))])
    store.close()
    return run


def pct(xs: list[float]) -> tuple[float, float]:
    a = np.array(xs) * 1000
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--disk", type=int, default=300, help="MiB of free space above the floor")
    ap.add_argument("--only", nargs="*", help="attack names (default: all)")
    ap.add_argument("--env", nargs="*", default=[], help="more ANDREA_NAME=VALUE settings")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="andrea-bench-writers-"))
    data_dir = root / "data"
    data_dir.mkdir()
    big = seed_big_run(data_dir, a.records)
    floor = shutil.disk_usage(data_dir).free - (a.disk << 20)
    env = {"ANDREA_ADMIN_TOKEN": ADMIN, "ANDREA_MIN_FREE_BYTES": str(floor),
           "ANDREA_MAX_CONNECTIONS_PER_CLIENT": "400", "ANDREA_RUN_BURST": "100",
           **dict(kv.split("=", 1) for kv in a.env)}
    proc, url = start_server(data_dir, env=env, timeout=300)
    try:
        batch = 1024
        tiny = new_run(url)
        tensors = len(tiny["layout"]["params"])
        victim = new_run(url, steps=20_000)

        def runs(n, **cfg):
            out = []
            for _ in range(n):
                try:
                    out.append(new_run(url, **cfg))
                except httpx.HTTPStatusError as e:
                    print(f"  a run for the attack was refused: {e.response.status_code} "
                          f"{e.response.json().get('detail')}")
            return out
        # The attacker asks for the biggest runs first; the server may refuse them at creation.
        fill = runs(3, steps=1_000_000, batch_size=batch) or runs(3, steps=20_000,
                                                                  batch_size=batch)
        ctx = {"batch": batch, "tensors": tensors, "fill_runs": fill, "records": a.records,
               "big_runs": runs(3, steps=1_000_000, batch_size=batch),
               "status_runs": runs(3), "big": big}
        if not ctx["big_runs"]:
            ctx["big_runs"] = runs(3, steps=20_000, batch_size=batch)
        victim_acks(url, victim, 1, 20)     # warm
        step = 21
        alone = victim_acks(url, victim, step, a.samples)
        step += a.samples
        rows = [("alone", *pct(alone), "")]
        print(f"victim ack alone: p50 {rows[0][1]:.1f} ms p99 {rows[0][2]:.1f} ms", flush=True)
        attacks = [(n, f) for n, f in ATTACKS if not a.only or n in a.only]
        if any(n == "disk fill" for n, _ in attacks):   # the disk fill last: it leaves it full
            attacks = [x for x in attacks if x[0] != "disk fill"] + [("disk fill", disk_fill)]
        for name, fn in attacks:
            stop, out = mp.Event(), mp.Queue()
            p = mp.Process(target=_attack_main, args=(fn, url, ctx, stop, out), daemon=True)
            p.start()
            time.sleep(1.0)
            got = victim_acks(url, victim, step, a.samples)
            step += a.samples
            stop.set()
            counts = out.get(timeout=180)
            p.join(30)
            rows.append((name, *pct(got), json.dumps(counts)[:110]))
            print(f"{name:16s} p50 {rows[-1][1]:7.1f} ms  p99 {rows[-1][2]:7.1f} ms  "
                  f"p99/alone {rows[-1][2] / rows[0][2]:5.2f}  {rows[-1][3]}", flush=True)
        free = shutil.disk_usage(data_dir).free
        print(f"free space above the floor at the end: {(free - floor) / (1 << 20):.0f} MiB")
        r = httpx.delete(f"{url}/api/runs/{fill[0]['id']}" if fill else url,
                         headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)
        print(f"the operator deletes an attacker's run at the end: {r.status_code}")
        print("\nattack            victim ack p50   p99      p99 / alone")
        for name, p50, p99, _ in rows:
            print(f"{name:16s}  {p50:8.1f} ms  {p99:8.1f} ms  {p99 / rows[0][2]:6.2f}")
    finally:
        stop_server(proc)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
