"""Room runs measured side by side (server/room/, DiLoCo across browser tabs): W workers as W
tabs of one Chromium sharing its GPU, each training S inner steps in rounds of H, beside one
browser alone for a worker's S steps (what a participant gets without the room), one with W x
the batch for S steps (what synchronous data parallelism would give) and one with W x the steps
(the room's tokens). Every model's final weights are evaluated the same way afterwards (the
engine in a /lab page: the mean loss on the run's first EVAL_BATCHES validation batches), and
each room's traffic is put beside per-step fp32 gradient all-reduce (each worker sending its
whole gradient every inner step). Under each room's row, each worker's mean time per round it
trained (its reports' timings, by its own clock: training, sending its pseudo-gradient, waiting
for the round to close, downloading and evaluating the next version) and the share of it that
is not training; then the room's.

On the GPU machine, after bench/gpu/unpack_app.sh (bench/gpu/README.md):
    . /tmp/andrea-gpu/env.sh && python3 -m bench.room --gpu --preset 12m --batch 32 \\
        --steps 800 --workers 4 8 --inner 25
Anywhere (SwiftShader, CPU timings), a smoke run of the same measurements:
    python -m bench.room --preset tiny --batch 4 --steps 16 --workers 2 --inner 8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from andrea.cli.browser_flags import webgpu_args
from andrea.cli.chromium import CHROMIUM
from andrea.cli.launch import served
from andrea.paths import weights_path
from bench.browser import andrea_train
from bench.room_table import EVAL_BATCHES, Said, outer_step, room_reports, round_phases


def room_run(url: str, preset: str, B: int, W: int, H: int, steps: int, codec: str,
             gpu: bool, outer: dict, precision: str, slow_ms: float = 0) -> dict:
    """A room of W tabs, each `steps` inner steps; -> its run id, rounds, bytes, seconds. The
    tabs all join from this machine's address: the room allows W from one address. slow_ms:
    the last tab waits this long before each step (a slower laptop; the Trainer's
    stepDelayMs). `outer` may also say wait_for_slowest and overlap."""
    from playwright.sync_api import sync_playwright

    r = httpx.post(f"{url}/api/runs", json={
        "preset": preset, "batch_size": B, "steps": steps, "seed": 1, "precision": precision,
        "room": {"inner_steps": H, "codec": codec, "max_workers": max(W, 1),
                 "workers_per_address": max(W, 1), "round_deadline_s": 3600, **outer}},
        timeout=60)
    r.raise_for_status()
    run = r.json()
    link = f"{url}/runs/{run['id']}#join={run['room']['join_token']}"
    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=webgpu_args(gpu))
        pages = []
        for i in range(W):
            page = browser.new_context().new_page()
            page.add_init_script("window.andreaAutoJoin = true;" +
                                 ("window.andreaGpuOnly = true;" if gpu else "") +
                                 (f"window.andreaStepDelayMs = {slow_ms};"
                                  if slow_ms and i == W - 1 else ""))
            page.goto(link)
            pages.append(page)
        for page in pages:
            page.wait_for_function("document.body.dataset.done !== undefined",
                                   timeout=24 * 3600_000, polling=1000)
            done = page.evaluate("document.body.dataset.done")
            if done != "finished":
                raise SystemExit(f"a worker ended {done}: {page.inner_text('#error')}")
        browser.close()
    room = httpx.get(f"{url}/api/runs/{run['id']}/room", timeout=60).json()
    return {"id": run["id"], "seconds": time.monotonic() - t0, "rounds": room["rounds"],
            "version": room["version"], "sent": sum(w["bytes"] for w in room["workers"]),
            "allreduce": room["allreduce_bytes_per_step"] * steps * W,
            "weights": f"/api/runs/{run['id']}/room/weights/{room['version']}",
            "reports": room_reports(url, run["id"])}


def final_weights(data_dir: Path, r: dict) -> str:
    """Where a run's final weights are: a room's last global version (a URL), a single run's
    final upload (a file in the server's data dir, fulfilled by the eval page's route)."""
    return r.get("weights") or str(weights_path(data_dir, r["id"]))


EVAL_JS = """
async ({layoutUrl, weightsUrl, valUrl, n}) => {
  const { parseBatch } = await import('/static/js/engine/batches.js');
  const layout = await (await fetch(layoutUrl)).json();
  const w = new Float32Array(await (await fetch(weightsUrl)).arrayBuffer());
  const model = await window.andrea.lab.createModel({ layout });
  model.setParams(w);
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const b = parseBatch(await (await fetch(valUrl.replace('{i}', i))).arrayBuffer());
    sum += (await model.lossAndGrads(b.inputs, b.targets, b.B, b.T)).loss;
  }
  model.destroy();
  return sum / n;
}
"""


class Evaluator:
    """The engine in a /lab page: a run's final weights' mean loss on its first EVAL_BATCHES
    validation batches (the same kernels for every run)."""

    def __init__(self, url: str, gpu: bool):
        from playwright.sync_api import sync_playwright
        self._p = sync_playwright().start()
        self._browser = self._p.chromium.launch(executable_path=CHROMIUM, args=webgpu_args(gpu))
        self.page = self._browser.new_page()
        self.page.set_default_timeout(3600_000)
        self.page.route("**/bench-weights/**", lambda route: route.fulfill(
            body=Path(route.request.url.split("/bench-weights", 1)[1]).read_bytes(),
            content_type="application/octet-stream"))
        self.page.goto(url + "/lab")
        self.page.wait_for_function("document.body.dataset.lab === 'ready'")

    def loss(self, run_id: str, weights: str) -> float:
        return self.page.evaluate(EVAL_JS, {
            "layoutUrl": f"/api/runs/{run_id}/layout",
            "weightsUrl": weights if weights.startswith("/api/") else "/bench-weights" + weights,
            "valUrl": f"/api/runs/{run_id}/val_batches/{{i}}", "n": EVAL_BATCHES})

    def close(self) -> None:
        self._browser.close()
        self._p.stop()


def single_run(url: str, preset: str, B: int, steps: int, gpu: bool, precision: str) -> dict:
    return andrea_train(url, ["--preset", preset, "--batch-size", str(B), "--steps", str(steps),
                              "--seed", "1", "--precision", precision, "--eval-every", "0",
                              "--sample-every", "0"], gpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--preset", default="12m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=800, help="each worker's inner steps")
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--inner", type=int, nargs="+", default=[25])
    ap.add_argument("--codec", default="int8")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "mixed"])
    ap.add_argument("--outer", nargs="+", default=[""],
                    help="outer lr,momentum pairs, one room row each (default: the room's)")
    ap.add_argument("--slow-ms", type=float, default=0,
                    help="one room tab waits this long before each step (a slower laptop)")
    ap.add_argument("--cut", action="store_true",
                    help="rooms that do not wait for the slowest (wait_for_slowest off)")
    ap.add_argument("--overlap", nargs="+", type=int, default=[0], choices=[0, 1],
                    help="0: rounds wait for the version; 1: overlapped (the room's overlap on): "
                    "a row each")
    ap.add_argument("--rows", nargs="+", default=["alone", "wide", "tokens", "room"],
                    choices=["alone", "wide", "tokens", "room"],
                    help="alone: one browser, a worker's steps; wide: W x the batch for as many "
                    "steps (data parallelism); tokens: W x the steps (the room's tokens); room")
    ap.add_argument("--out", help="also append the table to this file")
    ap.add_argument("--data-dir", type=Path)
    args = ap.parse_args()
    say = Said()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or Path(tmp)
        measure(args, data_dir, say)
    say.save(args.out)


def measure(args, data_dir: Path, say) -> None:
    """Each row trained, then evaluated and printed at once (a long bench split over several
    calls keeps what it measured)."""
    S, B, P = args.steps, args.batch, args.precision
    plan = []
    if "alone" in args.rows:
        plan.append((f"one browser alone ({S} steps)", lambda url: single_run(
            url, args.preset, B, S, args.gpu, P), False))
    for W in args.workers:
        if "wide" in args.rows:
            plan.append((f"one browser, batch {W}x ({S} steps)", lambda url, W=W: single_run(
                url, args.preset, W * B, S, args.gpu, P), False))
        if "tokens" in args.rows:
            plan.append((f"one browser, {W}x the steps ({W * S})", lambda url, W=W: single_run(
                url, args.preset, B, W * S, args.gpu, P), False))
        for H in args.inner if "room" in args.rows else ():
            for pair, overlap in ((p, o) for p in args.outer for o in args.overlap):
                outer = outer_step(pair)
                name = f"room of {W}, H {H}" + (
                    f", outer lr {outer['outer_lr']:g} mom. {outer['outer_momentum']:g}"
                    if outer else ", defaults")
                name += f", 1 tab +{args.slow_ms:g} ms/step" if args.slow_ms else ""
                if args.cut:
                    outer = {**outer, "wait_for_slowest": False}
                    name += ", cut"
                if overlap:
                    outer = {**outer, "overlap": True}
                    name += ", overlapped"
                plan.append((name, lambda url, W=W, H=H, outer=outer: room_run(
                    url, args.preset, B, W, H, S, args.codec, args.gpu, outer, P,
                    args.slow_ms), True))
    with served(data_dir) as url:
        say(f"# {args.preset} B {B} {P}, every worker {S} inner steps; {args.codec} "
            f"pseudo-gradients; eval: mean loss of the final weights on {EVAL_BATCHES} "
            "validation batches")
        say(f"{'run':42s} {'eval loss':>9s} {'vs alone':>8s} {'minutes':>7s} {'sent':>10s} "
            f"{'all-reduce':>10s} {'less':>6s}")
        alone = None
        for name, make, room in plan:
            r = make(url)
            judge = Evaluator(url, args.gpu)
            try:
                loss = judge.loss(r["id"], final_weights(data_dir, r))
            finally:
                judge.close()
            alone = loss if alone is None and name.startswith("one browser alone") else alone
            vs = f"{(loss / alone - 1) * 100:+7.1f}%" if alone else ""
            sent = f"{r['sent'] / 2**20:9.1f}M" if room else ""
            allr = f"{r['allreduce'] / 2**20:9.1f}M" if room else ""
            less = f"{r['allreduce'] / r['sent']:5.0f}x" if room else ""
            say(f"{name:42s} {loss:9.4f} {vs:>8s} {r['seconds'] / 60:7.2f} {sent:>10s} "
                f"{allr:>10s} {less:>6s}")
            for line in round_phases(r["reports"], r["rounds"]) if room else ():
                say(line)


if __name__ == "__main__":
    main()
