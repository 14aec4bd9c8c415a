"""Room runs in PyTorch against the real server, to choose the room's defaults (issue 52).

The browser bench (bench/room.py) measures the app itself: W tabs of one Chromium, minutes per
row. Choosing the outer step needs many more rows than that allows, so here each worker is a
PyTorch model (Hugging Face LlamaForCausalLM from the run's layout, on CUDA where there is one)
doing what static/js/engine/room_worker.js does, and everything else is the server's own: the
run and its version 0, each worker's batches (the room's batch route), the codec, the bounds,
the robust aggregate and the outer step (the pseudo-gradients go through POST .../deltas and
the next version comes back from GET .../weights), in-process (no sockets).

A worker, as the engine's: its AdamW state carried from round to round; the learning rate
follows the run's schedule (linear warmup, cosine) over the worker's own inner steps; the global
gradient norm clipped to max_norm; weight decay on the matrices only. Matmuls in TF32 on CUDA:
the rows are compared with each other, all computed the same way.

Rows: one worker alone for a worker's steps; one with W x the batch for as many steps (data
parallelism); one with W x the steps (the same tokens); the room with each outer setting
given. Every final model is evaluated the same way: mean loss on the run's first EVAL_BATCHES
validation batches.

    PYTHONPATH=$PWD python3 -m bench.room_torch --preset 12m --batch 32 --steps 800 \\
        --workers 4 --inner 25 --outer 0.7,0.9 1.0,0
Here (CPU, a smoke run): python -m bench.room_torch --preset tiny --batch 4 --steps 16 \\
        --workers 2 --inner 4 --outer 1.0,0
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from andrea.app import create_app
from andrea.config import Settings
from andrea.data import wire
from andrea.room import codec
from tests.conftest import LocalClient
from tests.reference import hf_model

EVAL_BATCHES = 8
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def lr_at(step: int, cfg: dict) -> float:
    """static/js/engine/schedule.js lrAt."""
    lr, warmup, steps, floor = cfg["lr"], cfg["warmup_steps"], cfg["steps"], cfg["min_lr_ratio"]
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


class Worker:
    """One trainer: an HF model on DEVICE whose flat weights follow the layout's offsets, and
    torch's AdamW with the engine's groups and hyperparameters."""

    def __init__(self, run: dict, w: np.ndarray):
        self.layout, self.cfg = run["layout"], run["config"]
        self.model = hf_model(self.layout, w.copy()).to(DEVICE)
        named = dict(self.model.named_parameters())
        self.params = [(named[p["name"]], p["offset"], p["numel"]) for p in self.layout["params"]]
        decay = {p["name"] for p in self.layout["params"] if p["decay"]}
        cfg = self.cfg
        self.opt = torch.optim.AdamW(
            [{"params": [named[n] for n in named if n in decay]},
             {"params": [named[n] for n in named if n not in decay], "weight_decay": 0.0}],
            lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
            weight_decay=cfg["weight_decay"])
        self.step = 0

    def set_flat(self, w: torch.Tensor) -> None:
        with torch.no_grad():
            for p, off, n in self.params:
                p.copy_(w[off:off + n].view_as(p))

    def flat(self) -> torch.Tensor:
        """The weights in the layout's flat f32 order (its padding zero)."""
        out = torch.zeros(self.layout["total_numel"], device=DEVICE)
        for p, off, n in self.params:
            out[off:off + n] = p.detach().reshape(-1)
        return out

    def train_step(self, tokens: torch.Tensor) -> torch.Tensor:
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, self.cfg)
        loss = lm_loss(self.model, tokens)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["max_norm"])
        self.opt.step()
        self.step += 1
        return loss.detach()


def lm_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=tokens[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))


class Batches:
    """A run's batches from the server's routes, fetched a few ahead on a thread."""

    def __init__(self, client, urls):
        self.c = client
        self.pool = ThreadPoolExecutor(2)
        self.ahead = [self.pool.submit(self.get, u) for u in urls]

    def get(self, url: str) -> torch.Tensor:
        r = self.c.get(url)
        r.raise_for_status()
        return torch.from_numpy(wire.decode(r.content).tokens.astype(np.int64))

    def __iter__(self):
        for f in self.ahead:
            yield f.result().to(DEVICE, non_blocking=True)


def eval_loss(client, run: dict, w: np.ndarray) -> float:
    model = hf_model(run["layout"], w.copy()).to(DEVICE)
    b = Batches(client, [f"/api/runs/{run['id']}/val_batches/{i}" for i in range(EVAL_BATCHES)])
    with torch.no_grad():
        return float(np.mean([float(lm_loss(model, t)) for t in b]))


def create(client, **config) -> dict:
    r = client.post("/api/runs", json={"seed": 1, "eval_every": 0, "sample_every": 0, **config})
    assert r.status_code == 201, r.text
    return r.json()


def weights(client, run: dict, version: int) -> np.ndarray:
    r = client.get(f"/api/runs/{run['id']}/room/weights/{version}")
    r.raise_for_status()
    return np.frombuffer(r.content, "<f4").copy()


def single(client, preset: str, B: int, steps: int) -> dict:
    """One trainer on a plain run's batches, from the run's seeded init (the room's version 0
    for the same seed and shape)."""
    from andrea.room.init import seeded_weights
    run = create(client, preset=preset, batch_size=B, steps=steps)
    w0 = seeded_weights(run["layout"], run["config"]["seed"])
    t0 = time.perf_counter()
    worker = Worker(run, w0)
    batches = Batches(client, [f"/api/runs/{run['id']}/batches/{s}" for s in range(steps)])
    for tokens in batches:
        worker.train_step(tokens)
    w = worker.flat().cpu().numpy()
    return {"run": run, "w": w, "seconds": time.perf_counter() - t0}


def room(client, preset: str, B: int, steps: int, W: int, H: int, lr: float, mu: float,
         codec_name: str, slow: float = 1.0, overlap: int = 0, guess: str = "own") -> dict:
    """overlap > 0: the room's overlap on (room_worker.js), each version arriving `overlap`
    steps into the round it starts: a worker trains on from its own weights while its
    pseudo-gradient goes up, the round closes and the version comes down, then moves the
    weights those steps made onto the version (version + its weights - its weights at the
    round's end) and trains the round's other steps from there.

    slow > 1: worker 0 is that many times slower than the others, in a room that does not
    wait for it (wait_for_slowest off): the others train H steps a round and send first (half
    of them cut the round), it trains the H / slow steps it would have taken meanwhile and
    sends those (the server weights each pseudo-gradient by its steps). Its speed is modelled,
    not timed: the steps it takes are what a slow machine's clock would allow."""
    cfg = {"inner_steps": H, "codec": codec_name, "max_workers": W, "workers_per_address": W,
           "round_deadline_s": 86_400, "outer_lr": lr, "outer_momentum": mu,
           "overlap": overlap > 0}
    if slow > 1:
        cfg["wait_for_slowest"] = False
    run = create(client, preset=preset, batch_size=B, steps=steps, room=cfg)
    rid = run["id"]
    auth = {"authorization": f"Bearer {run['room']['join_token']}"}
    tokens = [client.post(f"/api/runs/{rid}/room/workers", headers=auth).json()
              for _ in range(W)]
    w0 = weights(client, run, 0)
    workers = [Worker(run, w0) for _ in range(W)]
    rounds = -(-steps // H)
    fmt = run["room"]["batches"]
    t0, sent, outer = time.perf_counter(), 0, 0.0
    global_w = torch.from_numpy(w0).to(DEVICE)
    # Overlapped: where each worker starts its next round before the version is there (its
    # guess of that version); the version before this one.
    guesses: list[torch.Tensor | None] = [None] * W
    before = global_w
    order = list(range(1, W)) + [0] if slow > 1 else list(range(W))   # the slow one last
    for version in range(rounds):
        for i in order:
            me, worker = tokens[i], workers[i]
            k = max(1, int(H / slow)) if i == 0 and slow > 1 else H
            early = min(overlap, k) if guesses[i] is not None else 0   # before the version came
            if early:
                worker.set_flat(guesses[i])
            else:
                worker.set_flat(global_w)
            worker.step = version * H        # the schedule's place (a cut round skips steps)
            urls = [fmt.format(version=version, slot=me["slot"], step=s) for s in range(k)]
            for s, t in enumerate(Batches(client, urls)):
                if early and s == early:     # the version arrives: those steps move onto it
                    worker.set_flat(global_w + (worker.flat() - guesses[i]))
                worker.train_step(t)
            if early == k:
                worker.set_flat(global_w + (worker.flat() - guesses[i]))
            mine = worker.flat()
            if overlap:
                own = mine - global_w        # this round's step (moved onto the version)
                # own: the next version guessed as its own weights; last: as the version it
                # holds; eager (Kale et al. 2025): its own progress for 1/W of the step, the
                # last step for the rest.
                guesses[i] = {"own": lambda: mine, "last": lambda: global_w,
                              "eager": lambda: global_w + own / W
                              + (global_w - before) * (1 - 1 / W)}[guess]()
            delta = (global_w - mine).cpu().numpy()
            body = codec.encode(delta, codec_name)
            sent += len(body)
            t1 = time.perf_counter()
            r = client.post(f"/api/runs/{rid}/room/deltas/{version}?steps={k}", content=body,
                            headers={"authorization": f"Bearer {me['token']}"})
            assert r.status_code == 200, r.text
            outer += time.perf_counter() - t1
        t1 = time.perf_counter()
        st = client.get(f"/api/runs/{rid}/room").json()
        assert st["version"] == version + 1, st
        dropped = st["closed"][-1].get("dropped") or []
        if dropped:
            print(f"  round {version}: dropped {dropped}", flush=True)
        before = global_w
        global_w = torch.from_numpy(weights(client, run, version + 1)).to(DEVICE)
        outer += time.perf_counter() - t1
    return {"run": run, "w": global_w.cpu().numpy(), "seconds": time.perf_counter() - t0,
            "server_s": outer, "sent": sent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="12m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=800, help="each worker's inner steps")
    ap.add_argument("--workers", type=int, nargs="+", default=[4])
    ap.add_argument("--inner", type=int, nargs="+", default=[25])
    ap.add_argument("--outer", nargs="+", default=["0.7,0.9", "1.0,0"],
                    help="outer lr,momentum pairs, one room row each")
    ap.add_argument("--codec", default="int8")
    ap.add_argument("--overlap", type=int, nargs="*", default=[],
                    help="also each room row overlapped, a row per number of steps a worker "
                    "trains on before the version arrives")
    ap.add_argument("--guess", nargs="+", default=["own"], choices=["own", "last", "eager"],
                    help="overlapped: where a worker trains on from: its own weights, the "
                    "version it holds, or eager: 1/W of its own step and the rest the last "
                    "version's")
    ap.add_argument("--slow", type=float, nargs="*", default=[],
                    help="also a room row per factor: worker 0 that many times slower, in a "
                    "room that does not wait for it (its steps modelled, not timed)")
    ap.add_argument("--rows", nargs="+", default=["one", "wide", "tokens", "room", "slow"],
                    choices=["one", "wide", "tokens", "room", "slow"],
                    help="slow: only the --slow rows of the rooms")
    ap.add_argument("--out", help="also append the table to this file")
    ap.add_argument("--data-dir", type=Path, help="the server's data dir (default: a temporary "
                    "one); one kept between calls keeps its tokenized corpus")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    S, B = args.steps, args.batch
    with tempfile.TemporaryDirectory() as tmp, LocalClient(create_app(Settings(
            data_dir=args.data_dir or Path(tmp) / "data"))) as c:
        say(f"# {args.preset} B {B}, {S} inner steps a worker, {args.codec} pseudo-gradients, "
            f"PyTorch workers on {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU'}"
            f"; eval: mean loss on {EVAL_BATCHES} validation batches")
        say(f"{'run':44s} {'eval loss':>9s} {'vs one':>7s} {'seconds':>8s} {'server s':>8s}")
        base = None

        def row(name: str, r: dict) -> None:
            nonlocal base
            loss = eval_loss(c, r["run"], r["w"])
            base = loss if base is None and name.startswith("one tab,") else base
            vs = f"{(loss / base - 1) * 100:+6.1f}%" if base else ""
            srv = f"{r['server_s']:8.1f}" if "server_s" in r else ""
            say(f"{name:44s} {loss:9.4f} {vs:>7s} {r['seconds']:8.1f} {srv:>8s}")

        if "one" in args.rows:
            row(f"one tab, {S} steps", single(c, args.preset, B, S))
        for W in args.workers:
            if "wide" in args.rows:
                row(f"one tab, batch {W}x, {S} steps (data parallel)",
                    single(c, args.preset, W * B, S))
            if "tokens" in args.rows:
                row(f"one tab, {W}x the steps (same tokens)", single(c, args.preset, B, W * S))
            for H in args.inner if {"room", "slow"} & set(args.rows) else ():
                for pair in args.outer:
                    lr, mu = (float(x) for x in pair.split(","))
                    if "room" in args.rows:
                        row(f"room of {W}, H {H}, outer lr {lr:g} momentum {mu:g}",
                            room(c, args.preset, B, S, W, H, lr, mu, args.codec))
                        for tau in args.overlap:
                            for g in args.guess:
                                row(f"  overlapped ({g}), versions {tau} steps late",
                                    room(c, args.preset, B, S, W, H, lr, mu, args.codec,
                                         overlap=tau, guess=g))
                    for f in args.slow:
                        row(f"  the same, one {f:g}x slower, rounds cut",
                            room(c, args.preset, B, S, W, H, lr, mu, args.codec, f))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
