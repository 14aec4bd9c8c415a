"""bench/room.py's room rows with the workers under Node + Dawn instead of browser tabs
(bench/room_node.mjs: W of the engine's RoomWorkers in one process on one device, or with
--processes one process and device each, as W tabs have their own JS thread), so a GPU
machine with no browser measures a real room against a live server; the final global weights
are evaluated by the engine under Node too (room_node.mjs --eval). The same table as room.py's.

    DAWN_NODE=/tmp/gpu/dawn.node python3 -m bench.room_node --node /tmp/gpu/node \\
        --preset 12m --batch 32 --steps 800 --workers 4 --inner 25 [--precision mixed] \\
        [--overlap 0 1] [--processes]
Anywhere (SwiftShader: VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json):
    python -m bench.room_node --preset tiny --batch 4 --steps 16 --workers 2 --inner 8
(bench/gpu/README.md: on the GPU machine in one transfer.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from andrea.cli.launch import served
from bench.room_table import EVAL_BATCHES, Said, outer_step, room_reports, round_phases

SCRIPT = Path(__file__).with_name("room_node.mjs")


def node(args, *more: str) -> dict:
    """room_node.mjs with `more`: its last stdout line (JSON); its log goes to our stderr."""
    out = subprocess.run([args.node, str(SCRIPT), *more], stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit(f"room_node.mjs {' '.join(more[:2])}... exited {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def room_row(args, url: str, W: int, H: int, pair: str, overlap: bool) -> dict:
    t0 = time.monotonic()
    room = ["--preset", args.preset, "--batch", str(args.batch), "--steps", str(args.steps),
            "--inner", str(H), "--workers", str(W), "--precision", args.precision,
            "--codec", args.codec, *(["--outer", pair] if pair else []),
            *(["--cut"] if args.cut else []), *(["--overlap"] if overlap else [])]
    if args.processes:      # one process (one JS thread, one device) per worker, as tabs are
        made = node(args, url, *room, "--create")
        workers = [subprocess.Popen([args.node, str(SCRIPT), url, "--run", made["id"],
                                     "--join", made["join"], "--workers", "1"],
                                    stdout=subprocess.DEVNULL) for _ in range(W)]
        if any(p.wait() != 0 for p in workers):
            raise SystemExit(f"a worker of room {made['id']} did not finish")
        ran = made
    else:
        ran = node(args, url, *room)
    seconds = time.monotonic() - t0
    room = httpx.get(f"{url}/api/runs/{ran['id']}/room", timeout=60).json()
    return {"id": ran["id"], "seconds": seconds, "rounds": room["rounds"],
            "sent": sum(w["bytes"] for w in room["workers"]),
            "allreduce": room["allreduce_bytes_per_step"] * args.steps * W,
            "reports": room_reports(url, ran["id"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="12m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=800, help="each worker's inner steps")
    ap.add_argument("--workers", type=int, nargs="+", default=[4])
    ap.add_argument("--inner", type=int, nargs="+", default=[25])
    ap.add_argument("--codec", default="int8")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "mixed"])
    ap.add_argument("--outer", nargs="+", default=[""],
                    help="outer lr,momentum pairs, one room row each (default: the room's)")
    ap.add_argument("--cut", action="store_true",
                    help="rooms that do not wait for the slowest (wait_for_slowest off)")
    ap.add_argument("--overlap", nargs="+", type=int, default=[0], choices=[0, 1],
                    help="0: rounds wait for the version; 1: overlapped (the room's overlap on): "
                    "a row each")
    ap.add_argument("--processes", action="store_true",
                    help="each worker its own Node process (its own JS thread and device, as "
                    "tabs are); default: all in one process on one device")
    ap.add_argument("--node", default="node", help="the node binary")
    ap.add_argument("--out", help="also append the table to this file")
    ap.add_argument("--data-dir", type=Path)
    args = ap.parse_args()
    say = Said()

    with tempfile.TemporaryDirectory() as tmp, served(args.data_dir or Path(tmp)) as url:
        say(f"# {args.preset} B {args.batch} {args.precision}, every worker {args.steps} inner "
            f"steps; {args.codec} pseudo-gradients; eval: mean loss of the final weights on "
            f"{EVAL_BATCHES} validation batches; workers: Node + Dawn, "
            f"{'a process each' if args.processes else 'one process'}")
        say(f"{'run':42s} {'eval loss':>9s} {'vs alone':>8s} {'minutes':>7s} {'sent':>10s} "
            f"{'all-reduce':>10s} {'less':>6s}")
        for W in args.workers:
            for H in args.inner:
                for pair, overlap in ((p, o) for p in args.outer for o in args.overlap):
                    outer = outer_step(pair)
                    name = f"room of {W}, H {H}" + (
                        f", outer lr {outer['outer_lr']:g} mom. {outer['outer_momentum']:g}"
                        if outer else ", defaults") + (", cut" if args.cut else "") + (
                        ", overlapped" if overlap else "") + (
                        ", a process each" if args.processes else "")
                    r = room_row(args, url, W, H, pair, bool(overlap))
                    loss = node(args, url, "--eval", r["id"],
                                "--batches", str(EVAL_BATCHES))["loss"]
                    say(f"{name:42s} {loss:9.4f} {'':>8s} {r['seconds'] / 60:7.2f} "
                        f"{r['sent'] / 2**20:9.1f}M {r['allreduce'] / 2**20:9.1f}M "
                        f"{r['allreduce'] / r['sent']:5.0f}x")
                    for line in round_phases(r["reports"], r["rounds"]):
                        say(line)
    say.save(args.out)


if __name__ == "__main__":
    main()
