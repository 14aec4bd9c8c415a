// A whole training step (forward, loss, backward, grad norm, clip, AdamW: one encoder, one
// submit) of the engine under Node + Dawn, for one preset and batch shape, plus a per-kernel
// GPU-time breakdown with timestamp-query.
//
//   python -m andrea.optim 12m > /tmp/l12m.json
//   node bench/bench_step.mjs /tmp/l12m.json --batch 32 [--seq 256] [--iters 20] [--variant adamw]
//        [--precision fp32|mixed]
// Env: DAWN_NODE (Dawn's dawn.node; see bench/README.md).

import fs from 'node:fs';
import { backToBackMs, dawnContext, repo } from './dawn.mjs';

const { Model } = await import(`${repo}/static/js/engine/model.js`);
const { Optimizer } = await import(`${repo}/static/js/engine/optimizer.js`);
const { profileOps, summarize } = await import(`${repo}/static/js/engine/profiler.js`);

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const { layout, maps } = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
const B = Number(opt('--batch', 8));
const T = Number(opt('--seq', layout.config.seq_len));
const iters = Number(opt('--iters', 20));
const variant = opt('--variant', 'adamw');
const precision = opt('--precision', 'fp32');

const ctx = await dawnContext({ exactTimestamps: true, mixed: precision === 'mixed' });
const { device } = ctx;

const model = new Model(ctx, layout, { precision });
await model.init(0);
const optim = await Optimizer.create(ctx, layout, { variant, W: model.W, G: model.G,
  maps, hyper: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1,
    max_norm: 1.0, clip_mode: 'global' } });
if (optim.mirror) optim.initMirror(await model.getParams());
model.useOptimizer({ mirror: optim.mirror, scaler: optim.scaler });
const plan = await model.plan(B, T);
const V = layout.config.vocab_size;
const tokens = Uint32Array.from({ length: B * T }, (_, i) => (i * 7919 + 13) % V);
const targets = Uint32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % V);
model.writeBatch(plan, tokens, targets);

const ms = await backToBackMs({ model, optim, plan }, iters);

const profile = await profileOps(device, [...plan.forward, ...plan.loss, ...plan.backward]);
const rows = profile ? summarize(profile) : [];
const kernelMs = rows.reduce((a, r) => a + r.ms, 0);
const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.description].filter(Boolean).join(' ');
console.log(`${layout.preset ?? 'custom'}  B ${B}  T ${T}  ${variant}  ${precision}  on ${adapter}`);
console.log(`step ${ms.toFixed(2)} ms (wall, ${iters} steps back to back)  ` +
  `${Math.round((B * T * 1000) / ms)} tok/s  dispatches ${plan.forward.length + plan.loss.length + plan.backward.length} + optimizer`);
if (rows.length) {
  console.log(`per-kernel GPU time (each dispatch in its own pass; sum ${kernelMs.toFixed(2)} ms):`);
  for (const r of rows) {
    console.log(`  ${r.label.padEnd(26)} ${String(r.calls).padStart(3)}  ${r.ms.toFixed(3).padStart(9)} ms  ${(100 * r.ms / kernelMs).toFixed(1).padStart(5)}%`);
  }
}
