"""What hostile room workers can do (issue 50), measured on this machine's CPU:

1. Attacks. Rooms of the tiny preset, two rounds of 4 inner steps, honest workers in PyTorch
   (tests/api/test_room_hostile.py's TorchWorker, the engine's AdamW) beside 1 of 2, 1 of 4 and
   2 of 5 attackers: huge (the honest mean blown up to the AdamW bound), flip (the same,
   sign-flipped), random (noise at the bound), stale (a replay of an old delta). Each row: the
   room's final eval loss beside the honest room's (the same honest workers alone), and how
   far the weights ended from the honest room's, in honest steps.
2. Memory. A real `andrea serve`, a room of MODEL (63M parameters), 8 workers that each send
   an int8 pseudo-gradient: the server's RSS when idle with the room made, and its peak while
   the round closes (sampled every 10 ms), against the model's f32 size.

    .venv/bin/python -m bench.hostile_room [--skip-memory]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from andrea.app import create_app
from andrea.cli.launch import start_server, stop_server
from andrea.config import Settings
from andrea.room import codec
from tests.api.test_room_hostile import attack_table
from tests.conftest import LocalClient
from tests.trainer_client import rss_mib

MODEL = {"preset": "120m", "n_layer": 6, "steps": 100,
         "room": {"inner_steps": 50, "codec": "int8", "max_workers": 8,
                  "workers_per_address": 8}}


def attacks() -> None:
    with tempfile.TemporaryDirectory() as tmp, \
            LocalClient(create_app(Settings(data_dir=Path(tmp)))) as c:
        before, base, rows = attack_table(c)
    print(f"eval loss of version 0: {before:.4f}; honest room of 1: {base[1]:.4f}, "
          f"of 3: {base[3]:.4f}")
    print(f"{'attack':>7} {'hostile':>8} {'eval loss':>10} {'vs honest':>10} "
          f"{'weights away':>13}")
    for r in rows:
        print(f"{r['kind']:>7} {r['hostile']} of {r['honest'] + r['hostile']:<3} "
              f"{r['loss']:10.4f} {r['change'] * 100:+9.2f}% {r['away'] * 100:12.1f}%")


def memory() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp) / "data", env={"ANDREA_MAX_BODY_BYTES": "1048576"})
        try:
            with httpx.Client(base_url=url, timeout=600) as c:
                idle0 = rss_mib(proc.pid)
                t = time.perf_counter()
                r = c.post("/api/runs", json=MODEL)
                assert r.status_code == 201, r.text
                run = r.json()
                made = time.perf_counter() - t
                numel = run["layout"]["total_numel"]
                bound = c.get(f"/api/runs/{run['id']}/room").json()["open"]["delta_bound"]
                rng = np.random.default_rng(0)
                bodies = [codec.encode((rng.uniform(-1, 1, numel) * bound * 0.5)
                                       .astype(np.float32), "int8") for _ in range(8)]
                tokens = []
                for _ in range(8):
                    j = c.post(f"/api/runs/{run['id']}/room/workers",
                               headers={"authorization": f"Bearer {run['room']['join_token']}"})
                    tokens.append(j.json()["token"])
                for tok, body in zip(tokens[:7], bodies):
                    r = c.post(f"/api/runs/{run['id']}/room/deltas/0", content=body,
                               headers={"authorization": f"Bearer {tok}"})
                    assert r.status_code == 200, r.text
                idle = rss_mib(proc.pid)
                peak, done = [idle], threading.Event()

                def sample():
                    while not done.is_set():
                        peak.append(rss_mib(proc.pid))
                        time.sleep(0.01)
                th = threading.Thread(target=sample)
                th.start()
                t = time.perf_counter()
                r = c.post(f"/api/runs/{run['id']}/room/deltas/0", content=bodies[7],
                           headers={"authorization": f"Bearer {tokens[7]}"})
                took = time.perf_counter() - t
                done.set()
                th.join()
                assert r.json()["closed"] is True, r.text
            f32 = 4 * numel / 2**20
            print(f"room of {numel / 1e6:.1f}M parameters ({f32:.0f} MiB f32): made with its "
                  f"version 0 in {made:.1f} s; server RSS {idle0:.0f} MiB before, {idle:.0f} "
                  f"MiB with 7 pseudo-gradients in; the 8th and the close took {took:.1f} s, "
                  f"peak {max(peak):.0f} MiB: +{max(peak) - idle:.0f} MiB = "
                  f"{(max(peak) - idle) / f32:.2f}x the model's f32 size beyond idle")
        finally:
            stop_server(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    attacks()
    if not args.skip_memory:
        memory()


if __name__ == "__main__":
    main()
