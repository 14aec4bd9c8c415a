"""The server's side of a room round, timed in-process (no sockets, no GPU): W workers'
pseudo-gradients posted for a few rounds, each POST timed; the last of a round closes it (the
robust mean, the outer step, the version and its update written and hashed) and is the round's
wait for every worker. Then the next version's download (its update in an int8 room).

    PYTHONPATH=. python -m bench.room_close --preset 12m --workers 4 --rounds 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from andrea.app import create_app
from andrea.config import Settings
from andrea.room import codec
from andrea.room.rounds import param_mask
from tests.conftest import LocalClient


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="12m")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--codec", default="int8")
    args = ap.parse_args()
    W = args.workers
    with tempfile.TemporaryDirectory() as tmp, \
            LocalClient(create_app(Settings(data_dir=Path(tmp) / "data"))) as c:
        run = c.post("/api/runs", json={
            "preset": args.preset, "steps": 50 * (args.rounds + 1), "seed": 1,
            "eval_every": 0, "sample_every": 0,
            "room": {"inner_steps": 50, "codec": args.codec, "max_workers": W,
                     "workers_per_address": W, "round_deadline_s": 86_400}}).json()
        rid, n = run["id"], run["layout"]["total_numel"]
        join = {"authorization": f"Bearer {run['room']['join_token']}"}
        tokens = [c.post(f"/api/runs/{rid}/room/workers", headers=join).json()["token"]
                  for _ in range(W)]
        mask, rng = param_mask(run["layout"]), np.random.default_rng(0)
        print(f"# {args.preset} ({n / 1e6:.1f}M values), {W} workers, {args.codec}: seconds")
        print(f"{'version':>7s} {'posts (each)':>24s} {'closing post':>12s} {'download':>8s}")
        for v in range(args.rounds):
            bodies = [codec.encode((rng.standard_normal(n, np.float32) * 1e-3 + 1e-4) * mask,
                                   args.codec) for _ in range(W)]
            took = []
            for body, token in zip(bodies, tokens):
                t0 = time.perf_counter()
                r = c.post(f"/api/runs/{rid}/room/deltas/{v}", content=body,
                           headers={"authorization": f"Bearer {token}"})
                r.raise_for_status()
                took.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = c.get(f"/api/runs/{rid}/room/updates/{v + 1}" if args.codec == "int8"
                        else f"/api/runs/{rid}/room/weights/{v + 1}")
            got.raise_for_status()
            down = time.perf_counter() - t0
            print(f"{v:7d} {' '.join(f'{t:.3f}' for t in took[:-1]):>24s} {took[-1]:12.3f} "
                  f"{down:8.3f}")


if __name__ == "__main__":
    main()
