"""The app as users run it, on a GPU server: `andrea serve`, then `andrea train --gpu` through
the run page for 12m B 32 and 120m B 8, fp32 and 8-bit AdamW, a few hundred steps each. Prints,
in one run: the step time from the stored records beside the engine's back-to-back step in the
same browser (the /lab page, the same model and optimizer, nothing read back), the checkpoints'
read-back and upload in the browser, and the /kernels profile table of the 120m step.

On the GPU machine, after bench/gpu/unpack_app.sh (bench/gpu/README.md):
    . /tmp/andrea-gpu/env.sh && python3 -m bench.app_gpu [--steps 300] [--out FILE]
        [--precision fp32|mixed]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from andrea.cli.browser_flags import webgpu_args
from andrea.cli.chromium import CHROMIUM
from andrea.cli.launch import served

RUNS = [("12m", 32, "adamw"), ("12m", 32, "adamw_8bit"), ("120m", 8, "adamw"),
        ("120m", 8, "adamw_8bit")]
# --smoke: the same measurements of the tiny preset on SwiftShader, to check this script anywhere.
SMOKE_RUNS = [("tiny", 4, "adamw"), ("tiny", 4, "adamw_8bit")]

# The trainer's step without the trainer: model and optimizer encoded into one command buffer per
# step, submitted back to back, nothing read back (bench/dawn.mjs backToBackMs, in the page).
# `kinds` adds, each alone, what the app's step adds to it (--variants): the trainer's three
# timestamps a step, a new real batch written each step (the server's batches for the preset),
# and the per-token losses copied out for the readback ring. -> {kind: ms a step}.
STEP_TIMES = """
async ({preset, B, variant, iters, kinds, precision}) => {
  const { Model } = await import('/static/js/engine/model.js');
  const { Optimizer } = await import('/static/js/engine/optimizer.js');
  const { parseBatch } = await import('/static/js/engine/batches.js');
  const ctx = window.andrea.lab.ctx;
  const { device } = ctx;
  const layout = await (await fetch(`/api/presets/${preset}/layout`)).json();
  const maps = await (await fetch('/api/optimizer/maps')).json();
  const model = new Model(ctx, layout, { precision });
  await model.init(0);
  const optim = await Optimizer.create(ctx, layout, { variant, W: model.W, G: model.G, maps,
    hyper: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_norm: 1.0,
      clip_mode: 'global' }, lossScale: precision === 'mixed' ? {} : null });
  model.useOptimizer({ mirror: optim.mirror, scaler: optim.scaler });
  const T = layout.config.seq_len, V = layout.config.vocab_size, N = B * T;
  const plan = await model.plan(B, T);
  const synthetic = [Uint32Array.from({ length: N }, (_, i) => (i * 7919 + 13) % V),
    Uint32Array.from({ length: N }, (_, i) => (i * 104729 + 1) % V)];
  const real = [];
  for (let s = 0; s < 8 && kinds.some(([, o]) => o.batches); s++) {
    const q = `preset=${preset}&batch_size=${B}&steps=1000`;
    real.push(parseBatch(await (await fetch(`/api/batches/${s}?${q}`)).arrayBuffer()));
  }
  const stamps = device.features.has('timestamp-query')
    ? device.createQuerySet({ type: 'timestamp', count: 3 }) : null;
  const sink = device.createBuffer({ size: N * 4 + 64, usage: GPUBufferUsage.COPY_DST });
  const time = async (o) => {
    model.writeBatch(plan, ...synthetic);
    const step = (s) => {
      if (o.batches) model.writeBatch(plan, real[s % 8].inputs, real[s % 8].targets);
      optim.setStep(s, 1e-4);
      const enc = device.createCommandEncoder();
      model.encodeStep(enc, plan, o.stamps && stamps
        ? { timestampWrites: { querySet: stamps, beginningOfPassWriteIndex: 0 } } : null);
      optim.encode(enc, o.stamps && stamps ? { timestampWrites: { querySet: stamps,
        beginningOfPassWriteIndex: 1, endOfPassWriteIndex: 2 } } : {});
      if (o.readback) enc.copyBufferToBuffer(plan.acts.losses, 0, sink, 0, N * 4);
      device.queue.submit([enc.finish()]);
    };
    for (let s = 1; s <= 3; s++) step(s);
    await device.queue.onSubmittedWorkDone();
    const t0 = performance.now();
    for (let s = 4; s < 4 + iters; s++) step(s);
    await device.queue.onSubmittedWorkDone();
    return (performance.now() - t0) / iters;
  };
  const out = {};
  for (const [name, o] of kinds) out[name] = await time(o);
  model.destroy();
  optim.destroy();
  stamps?.destroy();
  sink.destroy();
  return out;
}
"""
PLAIN = [["plain", {}]]
VARIANTS = [["plain", {}], ["timestamps", {"stamps": True}], ["real batches", {"batches": True}],
            ["readback copy", {"readback": True}],
            ["all three", {"stamps": True, "batches": True, "readback": True}],
            ["plain again", {}]]

KERNEL_ROWS = """() => [...document.querySelectorAll('#kernels tbody tr')]
  .map((tr) => [...tr.cells].map((c) => c.textContent))"""


def train(url: str, preset: str, B: int, optimizer: str, steps: int, gpu: bool,
          precision: str) -> dict:
    cmd = [sys.executable, "-m", "andrea", "train", *(["--gpu"] if gpu else []), "--server", url,
           "--preset", preset, "--precision", precision,
           "--batch-size", str(B), "--optimizer", optimizer, "--steps", str(steps),
           "--checkpoint-every", str(max(1, steps // 3)), "--json"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    result = json.loads(r.stdout)
    if not result.get("ok"):
        raise SystemExit(f"andrea train failed ({preset} {optimizer}): {result.get('error')}\n"
                         f"{r.stderr[-2000:]}")
    result["wall_s"] = time.monotonic() - t0
    records = httpx.get(f"{url}/api/runs/{result['run_id']}/metrics", timeout=60).json()
    ms = [m["step_ms"] for m in records if m.get("step_ms")]
    result["record_median_ms"] = statistics.median(ms)
    result["record_mean_ms"] = statistics.fmean(ms)
    return result


def in_browser(url: str, iters: int, runs: list, gpu: bool, precision: str) -> tuple[dict, dict]:
    """Back-to-back step ms per run config, and the /kernels table of the last one's step."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=webgpu_args(gpu))
        try:
            page = open_page(browser, url, "/lab")
            b2b = {(pr, B, o): step_times(page, pr, B, o, iters, PLAIN, precision)["plain"]
                   for pr, B, o in runs}
            page.close()
            page = open_page(browser, url, "/kernels")
            page.select_option("#preset", runs[-1][0])
            page.fill("#batch", str(runs[-1][1]))
            page.select_option("#optimizer", "adamw")
            page.evaluate("delete document.body.dataset.profiled")
            page.click("#run")
            page.wait_for_function("document.body.dataset.profiled")
            kernels = {"status": page.inner_text("#status"), "rows": page.evaluate(KERNEL_ROWS)}
        finally:
            browser.close()
    return b2b, kernels


def open_page(browser, url: str, path: str):
    """/lab once its engine is ready, /kernels once its first profile is done."""
    page = browser.new_page()
    page.set_default_timeout(600_000)
    page.goto(url + path)
    page.wait_for_function("document.body.dataset.lab !== undefined" if path == "/lab"
                           else "document.body.dataset.profiled")
    return page


def step_times(page, preset: str, B: int, variant: str, iters: int, kinds: list,
               precision: str = "fp32") -> dict:
    return page.evaluate(STEP_TIMES, {"preset": preset, "B": B, "variant": variant,
                                      "iters": iters, "kinds": kinds, "precision": precision})


def variants(url: str, preset: str, B: int, iters: int, gpu: bool, precision: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=webgpu_args(gpu))
        try:
            return step_times(open_page(browser, url, "/lab"), preset, B, "adamw", iters,
                              VARIANTS, precision)
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--iters", type=int, default=50, help="back-to-back steps timed")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="tiny, on SwiftShader")
    ap.add_argument("--data-dir", type=Path, help="the server's (default: a new temporary one)")
    ap.add_argument("--only", help="only the runs of this preset (12m, 120m)")
    ap.add_argument("--precision", choices=("fp32", "mixed"), default="fp32",
                    help="the runs' and the back-to-back steps' (mixed: f16 matmuls, a GPU's)")
    ap.add_argument("--variants", action="store_true",
                    help="only what the app's step adds to the back-to-back one, each alone")
    args = ap.parse_args()
    runs, gpu = (SMOKE_RUNS, False) if args.smoke else (RUNS, True)
    runs = [r for r in runs if args.only in (None, r[0])]
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    if args.variants:
        with tempfile.TemporaryDirectory() as tmp, served(args.data_dir or Path(tmp)) as url:
            for preset, B in sorted({(r[0], r[1]) for r in runs}):
                ms = variants(url, preset, B, args.iters, gpu, args.precision)
                say(f"{preset} B {B}, adamw {args.precision}, ms a step back to back: " +
                    "  ".join(f"{k} {v:.2f}" for k, v in ms.items()))
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")
        return
    with tempfile.TemporaryDirectory() as tmp, served(args.data_dir or Path(tmp)) as url:
        results = {run: train(url, *run, args.steps, gpu, args.precision) for run in runs}
        b2b, kernels = in_browser(url, args.iters, runs, gpu, args.precision)
    first = next(iter(results.values()))
    version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout
    say(f"browser: {version.strip()} ({CHROMIUM})")
    say(f"adapter (recorded on the runs): {json.dumps(first['adapter'])}")
    say(f"andrea train{' --gpu' if gpu else ''} --precision {args.precision}, {args.steps} "
        f"steps each; step ms from the "
        f"stored records (median, mean: the mean includes evals, samples and checkpoints) beside "
        f"the engine's "
        f"back-to-back step in the same browser ({args.iters} steps)")
    say(f"{'run':<24}{'records med':>12}{'mean':>9}{'b2b':>9}{'b2b/app':>9}{'wall s':>8}")
    for run, r in results.items():
        ratio = b2b[run] / r["record_median_ms"]
        say(f"{' '.join(map(str, run)):<24}{r['record_median_ms']:>12.2f}"
            f"{r['record_mean_ms']:>9.2f}{b2b[run]:>9.2f}{ratio:>9.3f}{r['wall_s']:>8.0f}")
    say()
    say("the page's loop per step (ms, trainer.stats.loop: waits for a batch and a ring slot, "
        "GPU busy and idle between steps by timestamp-query)")
    for run, r in results.items():
        loop = (r.get("readback") or {}).get("loop") or {}
        n = max(loop.get("steps", 0), 1)
        say(f"  {' '.join(map(str, run)):<22}" + "  ".join(
            f"{k.removesuffix('Ms')} {loop.get(k, 0) / n:.2f}"
            for k in ("batchWaitMs", "ringWaitMs", "uploadMs", "encodeMs", "mapMs", "gpuBusyMs",
                      "gpuIdleMs")))
    say()
    say("checkpoints in the browser (read back from the GPU, then PUT to the server)")
    for run, r in results.items():
        for u in (r.get("readback") or {}).get("uploads", []):
            say(f"  {' '.join(map(str, run)):<22} step {u['step']:>4}  {u['mib']:8.1f} MiB  "
                f"read {u['readMs']:7.0f} ms  upload {u['uploadMs']:7.0f} ms")
    say()
    say(f"/kernels: {kernels['status']}")
    for row in kernels["rows"]:
        say(f"  {row[0]:<30}{row[1]:<34}" + "".join(f"{c:>10}" for c in row[2:]))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
