"""The source document's experiment: the same seed and data (the source bandit) with global
clipping, per-tensor clipping and no clipping, each trained by `andrea train` through the app's
page, then compared from the stored records and spikes. Prints one table and each run's link.

    python -m bench.clip_experiment --preset 12m --batch-size 32 --steps 1500 --gpu
    python -m bench.clip_experiment --preset tiny --batch-size 8 --steps 300      # any machine

Without --server it starts `andrea serve` on a fresh data dir (or --data-dir) for the duration.
The runs stay on the server: open /compare?ids=... (printed) to see them side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import httpx

from andrea.cli.launch import served

MODES = ("global", "per_tensor", "off")


def train(url: str, args, mode: str) -> dict:
    cmd = [sys.executable, "-m", "andrea", "train", *(["--gpu"] if args.gpu else []),
           "--server", url, "--preset", args.preset, "--batch-size", str(args.batch_size),
           "--steps", str(args.steps), "--seed", str(args.seed), "--data-mode", "bandit",
           "--clip-mode", mode, "--json", *(["--lr", str(args.lr)] if args.lr else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    result = json.loads(r.stdout or "{}")
    if not result.get("run_id"):
        raise SystemExit(f"andrea train --clip-mode {mode} failed: {result.get('error')}\n"
                         f"{r.stderr}")
    return result


def summary(url: str, run_id: str) -> dict:
    recs = httpx.get(f"{url}/api/runs/{run_id}/metrics", timeout=120).json()
    spikes = httpx.get(f"{url}/api/runs/{run_id}/spikes", timeout=120).json()["spikes"]
    loss = [r["loss"] for r in recs if r["loss"] is not None]
    norms = [r["grad_norm"] for r in recs if r["grad_norm"] is not None]
    evals = [r["eval_loss"] for r in recs if r.get("eval_loss") is not None]
    denoms = [r["softmax_denom_min"] for r in recs if r.get("softmax_denom_min") is not None]
    logits = [r["logit_max"] for r in recs if r.get("logit_max") is not None]
    layers = {}
    for s in spikes:
        if s.get("layer"):
            layers[s["layer"]["name"]] = layers.get(s["layer"]["name"], 0) + 1
    return {
        "steps": len(recs), "non-finite loss steps": len(recs) - len(loss),
        "final loss (last 50)": statistics.fmean(loss[-50:]) if loss else math.nan,
        "best eval": min(evals) if evals else math.nan,
        "median / max grad norm": f"{statistics.median(norms):.3g} / {max(norms):.3g}",
        "clipped steps": sum(1 for r in recs if (r["clip_scale"] or 1) < 1),
        "spikes": len(spikes),
        "at a phase boundary": sum(1 for s in spikes if s.get("boundary")),
        "spike layers": ", ".join(f"{k} {v}" for k, v in
                                  sorted(layers.items(), key=lambda x: -x[1])[:3]),
        "max |logit|": max(logits) if logits else math.nan,
        "min softmax denominator": min(denoms) if denoms else math.nan,
        "non-finite grad elements": sum(r.get("grad_nonfinite") or 0 for r in recs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="default: RunConfig's")
    ap.add_argument("--gpu", action="store_true", help="andrea train --gpu")
    ap.add_argument("--server", default=None)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--modes", default=",".join(MODES), help="a subset of " + ",".join(MODES))
    args = ap.parse_args()
    modes = args.modes.split(",")
    with (nullcontext(args.server) if args.server else
          served(args.data_dir or Path(tempfile.mkdtemp(prefix="andrea-")))) as url:
        ids, rows = [], {}
        for mode in modes:
            result = train(url, args, mode)
            ids.append(result["run_id"])
            rows[mode] = summary(url, result["run_id"])
            print(f"clip_mode {mode}: run {result['run_id']} ({result.get('status')}), "
                  f"adapter {result.get('adapter')}", flush=True)
        print(f"\n{args.preset} B {args.batch_size}, {args.steps} steps, seed {args.seed}, "
              f"source bandit, lr {args.lr or 'default'}")
        keys = list(rows[modes[0]])
        print(f"{'':28}" + "".join(f"{m:>22}" for m in modes))
        for k in keys:
            cells = [rows[m][k] for m in modes]
            fmt = [f"{c:.4g}" if isinstance(c, float) else str(c) for c in cells]
            print(f"{k:28}" + "".join(f"{c:>22}" for c in fmt))
        print(f"\ncompare: {url}/compare?ids={','.join(ids)}")


if __name__ == "__main__":
    main()
