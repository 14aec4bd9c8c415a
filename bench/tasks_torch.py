"""How fast a toy task is learned (server/tasks.py), with PyTorch doing what a training tab
does: to size the toy preset and its defaults before the app's own measurement (bench/tasks.py).

Each row is one run created on the real server (in process): its batches, its held-out
problems and its init (the room's seeded init, the engine's distributions) are the server's;
the trainer is bench/room_torch.py's Worker (Hugging Face LlamaForCausalLM, torch's AdamW with
the run's groups, schedule and clipping). Every `--every` steps the exact-match accuracy on
EVAL_BATCHES held-out batches (tasks.exact_match: every answer token the argmax). Prints, per
row, the first step (and seconds of training) at which it reached 50%, 90% and 99%.

    python -m bench.tasks_torch --tasks reverse sort add --preset toy --steps 600
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from andrea import tasks
from andrea.app import create_app
from andrea.config import Settings
from andrea.data import wire
from andrea.room.init import seeded_weights
from bench.room_torch import DEVICE, Worker, create
from tests.conftest import LocalClient

EVAL_BATCHES = 4
LEVELS = (0.5, 0.9, 0.99)


def accuracy(client, run: dict, model) -> float:
    f = tasks.facts(run["config"]["task"], run["config"]["task_digits"])
    right = total = 0
    for i in range(EVAL_BATCHES):
        r = client.get(f"/api/runs/{run['id']}/val_batches/{i}")
        tok = wire.decode(r.content).tokens.astype(np.int64)
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(tok[:, :-1]).to(DEVICE)).logits
        a, n = tasks.exact_match(tok, logits.argmax(-1).cpu().numpy(), f)
        right, total = right + a, total + n
    return right / total


def run_task(client, task: str, args) -> dict:
    shape = {k: v for k, v in (("n_layer", args.layers), ("n_embd", args.width)) if v}
    run = create(client, preset=args.preset, task=task, batch_size=args.batch, steps=args.steps,
                 lr=args.lr, **({"task_digits": args.digits} if args.digits else {}), **shape)
    worker = Worker(run, seeded_weights(run["layout"], run["config"]["seed"]))
    reached, train_s, curve = {}, 0.0, []
    for step in range(args.steps):
        r = client.get(f"/api/runs/{run['id']}/batches/{step}")
        tok = torch.from_numpy(wire.decode(r.content).tokens.astype(np.int64)).to(DEVICE)
        t0 = time.perf_counter()
        worker.train_step(tok)
        train_s += time.perf_counter() - t0
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            acc = accuracy(client, run, worker.model)
            curve.append((step + 1, acc))
            for lv in LEVELS:
                reached.setdefault(lv, (step + 1, train_s)) if acc >= lv else None
            if acc >= LEVELS[-1] and args.stop:
                break
    return {"run": run, "reached": reached, "curve": curve, "train_s": train_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["reverse", "sort", "add"],
                    choices=tasks.TASKS)
    ap.add_argument("--preset", default="toy")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--digits", type=int)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--stop", action="store_true", help="stop a row once it reaches 99%%")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: its default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp, LocalClient(create_app(Settings(
            data_dir=Path(tmp) / "data"))) as c:
        print(f"# {args.preset} B {args.batch} lr {args.lr}, PyTorch on "
              f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU'}")
        print(f"{'task':18s} {'model':16s} " + " ".join(f"{f'{lv:.0%} at':>16s}" for lv in LEVELS)
              + f" {'last':>6s}")
        for task in args.tasks:
            r = run_task(c, task, args)
            cfg = r["run"]["config"]
            cells = [f"{r['reached'][lv][0]:>6d} ({r['reached'][lv][1]:5.1f} s)"
                     if lv in r["reached"] else f"{'-':>16s}" for lv in LEVELS]
            print(f"{task + ' ' + str(cfg['task_digits']):18s} "
                  f"{'L%d C%d' % (cfg['n_layer'], cfg['n_embd']):16s} {' '.join(cells)} "
                  f"{r['curve'][-1][1]:6.1%}", flush=True)
            print("  curve: " + " ".join(f"{s}:{a:.2f}" for s, a in r["curve"]), flush=True)


if __name__ == "__main__":
    main()
