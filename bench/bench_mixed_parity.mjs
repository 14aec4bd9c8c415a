// Mixed precision against fp32 on one batch: the same model (init seed 0) and batch through the
// engine's fp32 kernels and through its mixed-precision linears (f16 operands, f32 accumulation:
// mma.js), under Node + Dawn. Prints the loss of each and, per tensor, the relative difference
// of the gradients ||g_mixed - g_fp32|| / ||g_fp32|| (with the fraction of elements that are zero
// in the mixed gradient but not in fp32: gradients lost to f16 underflow).
//
//   node bench/bench_mixed_parity.mjs .gpu/l12.json --batch 32 [--seq 256]
// Env: DAWN_NODE (Dawn's dawn.node; see gpu/README.md).

import fs from 'node:fs';
import { dawnContext, repo } from './dawn.mjs';

const { Model } = await import(`${repo}/static/js/engine/model.js`);
const { MMA_FEATURES } = await import(`${repo}/static/js/engine/mma.js`);
const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const { layout } = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
const B = Number(opt('--batch', 8));
const T = Number(opt('--seq', layout.config.seq_len));
const V = layout.config.vocab_size;
const ctx = await dawnContext({ toggles: ['vulkan_enable_f16_on_nvidia'], requiredFeatures: MMA_FEATURES });
const tokens = Uint32Array.from({ length: B * T }, (_, i) => (i * 7919 + 13) % V);
const targets = Uint32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % V);

const run = async (precision) => {
  const model = new Model(ctx, layout, { precision });
  await model.init(0);
  const r = await model.lossAndGrads(tokens, targets, B, T);
  model.destroy?.();
  return r;
};
const f = await run('fp32');
const m = await run('mixed');
console.log(`${layout.preset ?? 'custom'} B ${B} T ${T}: loss fp32 ${f.loss.toFixed(6)}  mixed ${m.loss.toFixed(6)}  ` +
  `diff ${(m.loss - f.loss).toExponential(2)}`);
let worst = 0;
for (const p of layout.params) {
  let d2 = 0;
  let n2 = 0;
  let lost = 0;
  for (let i = p.offset; i < p.offset + p.numel; i++) {
    const d = m.grads[i] - f.grads[i];
    d2 += d * d;
    n2 += f.grads[i] * f.grads[i];
    if (m.grads[i] === 0 && f.grads[i] !== 0) lost++;
  }
  const rel = Math.sqrt(d2 / Math.max(n2, 1e-300));
  worst = Math.max(worst, rel);
  console.log(`  ${p.name.padEnd(44)} |g| ${Math.sqrt(n2).toExponential(2)}  rel diff ${rel.toExponential(2)}` +
    `  zeroed ${(lost / p.numel * 100).toFixed(2)}%`);
}
console.log(`worst per-tensor relative gradient difference ${worst.toExponential(2)}`);
