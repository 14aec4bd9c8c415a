"""What the server side of a checkpoint costs: PUT /api/runs/{id}/checkpoints/{step} of a
12m or 120m training state to a real `andrea serve` on this machine (streamed to disk, chunk
SHA-256 checked, fsync, rename, pruned to the last two), and the download a resume makes.

    python bench/bench_checkpoint_upload.py [--presets 12m,120m] [--optimizers adamw,adamw_8bit]

The body is random bytes of exactly the run's sections; figures are wall time on the client.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from andrea.cli.launch import served  # noqa: E402


def upload(client: httpx.Client, run: dict, step: int, body: bytes, chunk: int) -> float:
    digests = ",".join(hashlib.sha256(body[i:i + chunk]).hexdigest()
                       for i in range(0, len(body), chunk))
    # Sent in 1 MiB pieces, as a browser streams a Blob: httpx given one 1 GB bytes object spends
    # ~20 s of system time copying it (measured), which is the client's cost, not the server's.
    view = memoryview(body)
    pieces = (bytes(view[i:i + (1 << 20)]) for i in range(0, len(body), 1 << 20))
    t0 = time.perf_counter()
    r = client.put(f"/api/runs/{run['id']}/checkpoints/{step}", content=pieces,
                   headers={"authorization": f"Bearer {run['token']}",
                            "content-type": "application/octet-stream",
                            "x-andrea-chunk-sha256": digests})
    r.raise_for_status()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="12m,120m")
    ap.add_argument("--optimizers", default="adamw,adamw_8bit")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"{'preset':6} {'optimizer':10} {'MiB':>8} {'upload ms':>10} {'MiB/s':>7} "
          f"{'download ms':>12}")
    with served(Path(tempfile.mkdtemp(prefix="andrea-bench-"))) as url, \
            httpx.Client(base_url=url, timeout=600) as client:
        for preset in args.presets.split(","):
            for optimizer in args.optimizers.split(","):
                run = client.post("/api/runs", json={"preset": preset, "optimizer": optimizer,
                                                     "steps": 1000}).json()
                ck = run["checkpoint"]
                size = sum(s["bytes"] for s in ck["sections"])
                body = os.urandom(size)
                ups = sorted(upload(client, run, 10 * (i + 1), body, ck["chunk_bytes"])
                             for i in range(args.reps))
                t0 = time.perf_counter()
                got = client.get(f"/api/runs/{run['id']}/checkpoints/{10 * args.reps}",
                                 headers={"authorization": f"Bearer {run['token']}"})
                down = time.perf_counter() - t0
                assert got.content == body
                mib = size / 2 ** 20
                up = ups[len(ups) // 2]
                print(f"{preset:6} {optimizer:10} {mib:8.1f} {up * 1e3:10.0f} {mib / up:7.0f} "
                      f"{down * 1e3:12.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
