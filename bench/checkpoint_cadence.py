"""How much work a crash would lose with the automatic checkpoint interval (issue 36): `andrea
serve`, then `andrea train` with --checkpoint-every left empty, as a user runs it. Prints, per
run, the steps checkpointed, the training between them (steps and seconds, from the stored
records' commit times), the largest of those (the work at risk) beside the bound the trainer
keeps (the larger of RISK_STEPS steps and RISK_MS of training, static/js/engine/checkpoint.js),
and each checkpoint's read-back and upload in the browser. Figures, not a verdict.

    .venv/bin/python -m bench.checkpoint_cadence --run tiny:8:200       # SwiftShader
    python3 -m bench.checkpoint_cadence --gpu --run 12m:32:5000 --run 120m:8:700   # a GPU
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from andrea.cli.launch import served

ENGINE = Path(__file__).resolve().parents[1] / "static/js/engine/checkpoint.js"


def risk_bound() -> tuple[int, float]:
    """(RISK_STEPS, RISK_MS / 1000) as the engine has them."""
    text = ENGINE.read_text()
    steps = int(re.search(r"RISK_STEPS = (\d+)", text).group(1))
    ms = int(re.search(r"RISK_MS = ([\d_]+)", text).group(1).replace("_", ""))
    return steps, ms / 1000


def train(url: str, preset: str, batch: int, steps: int, gpu: bool) -> dict:
    cmd = [sys.executable, "-m", "andrea", "train", *(["--gpu"] if gpu else []), "--server", url,
           "--preset", preset, "--batch-size", str(batch), "--steps", str(steps), "--json"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if not result.get("ok"):
        raise SystemExit(f"andrea train failed ({preset}): {result.get('error')}\n"
                         f"{r.stderr[-2000:]}")
    result["wall_s"] = time.monotonic() - t0
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append", required=True, help="PRESET:BATCH:STEPS")
    ap.add_argument("--gpu", action="store_true", help="andrea train --gpu")
    args = ap.parse_args()
    risk_steps, risk_s = risk_bound()
    print(f"bound: the larger of {risk_steps} steps and {risk_s:g} s of training between "
          "checkpoints (every step after the last one is at risk until the run ends)")
    with tempfile.TemporaryDirectory() as tmp, served(Path(tmp)) as url:
        for spec in args.run:
            preset, batch, steps = spec.split(":")
            result = train(url, preset, int(batch), int(steps), args.gpu)
            records = httpx.get(f"{url}/api/runs/{result['run_id']}/metrics",
                                timeout=120).json()
            at = {m["step"]: m["time"] for m in records}
            uploads = result["readback"]["uploads"]
            # Step 0 has no record: the training before the first checkpoint counts from the
            # first record's commit.
            marks = [0] + [u["step"] for u in uploads]
            start = at[min(at)]
            med = statistics.median(m["step_ms"] for m in records if m.get("step_ms"))
            print(f"\n{preset} batch {batch}, {steps} steps: {result['wall_s']:.0f} s, "
                  f"record step median {med:.1f} ms, {len(uploads)} checkpoints")
            print(f"  {'step':>6} {'since last':>11} {'s of training':>14} {'read ms':>9} "
                  f"{'upload ms':>10}")
            worst_steps = worst_s = 0.0
            for prev, u in zip(marks, uploads):     # (marks: one more, the run's end aside)
                gap = u["step"] - prev
                secs = at[u["step"]] - at.get(prev, start)
                worst_steps, worst_s = max(worst_steps, gap), max(worst_s, secs)
                print(f"  {u['step']:>6} {gap:>11} {secs:>14.1f} {u['readMs']:>9.0f} "
                      f"{u['uploadMs']:>10.0f}")
            tail = int(steps) - marks[-1]
            tail_s = at[int(steps)] - at.get(marks[-1], start)
            print(f"  after the last: {tail} steps, {tail_s:.1f} s (the run's end)")
            print(f"  largest gap: {worst_steps:.0f} steps, {worst_s:.1f} s; bound here: "
                  f"{max(risk_steps, risk_s * 1000 / med):.0f} steps")


if __name__ == "__main__":
    main()
