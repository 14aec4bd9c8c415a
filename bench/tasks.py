"""Toy tasks learned through the app (server/tasks.py): how long a run takes to reach
50%, 90% and 99% exact match on held-out problems, in training seconds and steps.

Each row is `andrea train` (the run page in headless Chromium: SwiftShader here, the GPU with
--gpu) on a fresh server; every eval's record carries the held-out batch's exact match
(eval_acc) and the server's commit time, so the time to a level is read from the records: the
wall time from the run's first record to the first eval at or above it (compiling the kernels
before step 1 is not training). Each row trains --steps steps.

    python -m bench.tasks --preset toy --tasks reverse sort add --steps 3000      # SwiftShader
    python -m bench.tasks --gpu --preset toy --tasks reverse sort add --steps 20000
"""

from __future__ import annotations

import argparse

import httpx

from andrea import tasks
from andrea.cli.launch import served
from bench.browser import andrea_train

LEVELS = (0.5, 0.9, 0.99)


def train(url: str, task: str, args) -> dict:
    return andrea_train(url, ["--preset", args.preset, "--task", task,
                              *(["--task-digits", str(args.digits)] if args.digits else []),
                              "--batch-size", str(args.batch), "--steps", str(args.steps),
                              "--seed", "1", "--eval-every", str(args.every),
                              "--sample-every", "0"], args.gpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--preset", default="toy")
    ap.add_argument("--tasks", nargs="+", default=["reverse", "sort", "add"], choices=tasks.TASKS)
    ap.add_argument("--digits", type=int)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=50, help="eval every this many steps")
    ap.add_argument("--out", help="also append the table to this file")
    args = ap.parse_args()
    where = "GPU" if args.gpu else "SwiftShader"
    lines = [f"# {args.preset} B {args.batch}, through the app ({where}), eval every "
             f"{args.every} steps",
             f"{'task':12s} " + " ".join(f"{f'{lv:.0%} at':>18s}" for lv in LEVELS)
             + f" {'last':>6s} {'steps':>6s} {'s/step':>7s}"]
    print("\n".join(lines), flush=True)
    with served() as url:
        for task in args.tasks:
            run = train(url, task, args)
            recs = httpx.get(f"{url}/api/runs/{run['id']}/metrics", timeout=60).json()
            cfg = httpx.get(f"{url}/api/runs/{run['id']}").json()["config"]
            t0 = recs[0]["time"] - recs[0]["step_ms"] / 1000
            evals = [(r["step"], r["time"] - t0, r["eval_acc"]) for r in recs if "eval_acc" in r]
            cells = []
            for lv in LEVELS:
                hit = next(((s, t) for s, t, a in evals if a >= lv), None)
                cells.append(f"{hit[1]:8.1f} s ({hit[0]:>5d})" if hit else f"{'-':>18s}")
            per_step = (recs[-1]["time"] - t0) / recs[-1]["step"]
            line = (f"{task + ' ' + str(cfg['task_digits']):12s} {' '.join(cells)} "
                    f"{evals[-1][2]:6.1%} {recs[-1]['step']:6d} {per_step:7.3f}")
            print(line, flush=True)
            print("  " + " ".join(f"{s}:{a:.2f}" for s, _, a in evals), flush=True)
            lines.append(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
