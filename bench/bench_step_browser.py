"""Time one training step (forward + loss + backward, one encoder, one submit) of a preset in
headless Chromium here (SwiftShader: CPU timings). Usage:
    python -m bench.bench_step_browser [--preset tiny] [--batch 8] [--steps 10]"""

import argparse
import json

from bench.browser import lab_page, served

STEP_JS = """
async ({preset, B, steps}) => {
  const {lab} = window.andrea;
  const model = await lab.createModel({preset, seed: 0});
  const T = model.config.seq_len, V = model.config.vocab_size;
  const tokens = Uint32Array.from({length: B * T}, (_, i) => (i * 7919) % V);
  const targets = Uint32Array.from({length: B * T}, (_, i) => (i * 104729 + 1) % V);
  const t0 = performance.now();
  const plan = await model.plan(B, T);
  const planMs = performance.now() - t0;
  model.writeBatch(plan, tokens, targets);
  const dev = lab.ctx.device;
  const run = async () => {
    const enc = dev.createCommandEncoder();
    model.encodeStep(enc, plan);
    dev.queue.submit([enc.finish()]);
    await dev.queue.onSubmittedWorkDone();
  };
  await run(); await run();  // warm-up
  const times = [];
  for (let i = 0; i < steps; i++) {
    const s = performance.now(); await run(); times.push(performance.now() - s);
  }
  times.sort((a, b) => a - b);
  return {preset, B, T, planMs, medianMs: times[times.length >> 1], minMs: times[0],
          dispatches: plan.forward.length + plan.loss.length + plan.backward.length,
          adapter: lab.info.adapter};
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with served() as url, lab_page(url) as page:
        r = page.evaluate(STEP_JS, {"preset": args.preset, "B": args.batch, "steps": args.steps})
    tok = r["B"] * r["T"]
    print(json.dumps(r["adapter"]))
    print(f"preset {r['preset']}  B {r['B']}  T {r['T']}  ops {r['dispatches']}  "
          f"plan {r['planMs']:.0f} ms  step median {r['medianMs']:.1f} ms  "
          f"min {r['minMs']:.1f} ms  "
          f"{tok / r['medianMs'] * 1000:.0f} tok/s")


if __name__ == "__main__":
    main()
