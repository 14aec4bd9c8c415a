"""What a step record takes in the store: bytes per record on the wire (compact JSON, as the
engine sends it) and in a SQLite file (the store's real rows: the file's used pages after a
checkpoint), by batch size (per-row losses) and tensors (per-tensor grad norms), beside the
estimate of server/storage.py (row_bytes) that the storage budget counts with.

    .venv/bin/python -m bench.record_bytes [--records 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import tempfile
from pathlib import Path

from andrea.metrics import Record
from andrea.run_config import RunConfig, StoredRunConfig
from andrea.storage import payload_of_wire, row_bytes
from andrea.store import Store

SHAPES = [(0, 0), (8, 0), (64, 0), (80, 0), (88, 0), (256, 0), (512, 0), (1024, 0), (8, 20),
          (8, 29), (8, 578), (1024, 578)]


def d7(x: float) -> float:
    return float(f"{x:.7g}")


def record(step: int, batch: int, tensors: int) -> dict:
    """A record as static/js/engine/step_record.js makes it (7 significant digits per list)."""
    return {"step": step, "loss": d7(4 + random.random()), "grad_norm": d7(random.random()),
            "clip_scale": 1.0, "lr": 0.0003, "tokens_per_s": 123456.789, "step_ms": 12.345,
            "opt_ms": 1.234, "source_losses": {"0": 4.1234567, "1": 4.3456789},
            "row_losses": [d7(3 + random.random()) for _ in range(batch)],
            "tensor_grad_norms": [d7(random.random() * 0.01) for _ in range(tensors)],
            "grad_nonfinite": 0, "logit_max": d7(12 * random.random()),
            "softmax_denom_min": d7(1 + random.random())}


def measure(folder: Path, batch: int, tensors: int, n: int) -> tuple[float, float]:
    """(wire bytes, stored bytes) per record of one shape, in a fresh SQLite store."""
    path = folder / f"b{batch}_t{tensors}.sqlite"
    store = Store(path)
    store.runs.create("r", StoredRunConfig.of(RunConfig(preset="tiny"), ""), "h")
    wire = 0
    for first in range(1, n + 1, 500):
        records = [record(s, batch, tensors) for s in range(first, min(first + 500, n + 1))]
        wire += len(json.dumps({"type": "metrics", "records": records}, separators=(",", ":")))
        store.metrics.add("r", [Record.model_validate(r).row() for r in records])
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        used = (db.execute("PRAGMA page_count").fetchone()[0]
                - db.execute("PRAGMA freelist_count").fetchone()[0])
        used *= db.execute("PRAGMA page_size").fetchone()[0]
    # (the empty store's pages: a few KiB, nothing beside n records)
    return wire / n, used / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    args = ap.parse_args()
    random.seed(0)
    print(f"{'batch':>6} {'tensors':>8} {'wire B':>8} {'stored B':>9} {'estimate B':>11} ratio")
    with tempfile.TemporaryDirectory() as tmp:
        for batch, tensors in SHAPES:
            wire, stored = measure(Path(tmp), batch, tensors, args.records)
            est = row_bytes(payload_of_wire(wire, batch + tensors + 4))
            print(f"{batch:6d} {tensors:8d} {wire:8.0f} {stored:9.0f} {est:11.0f} "
                  f"{est / stored:5.2f}")


if __name__ == "__main__":
    main()
