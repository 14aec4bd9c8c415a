// Mixed precision against fp32 on one batch: the same model (init seed 0) and batch through the
// engine's fp32 kernels and through its mixed-precision linears (f16 operands, f32 accumulation:
// mma.js), under Node + Dawn. Prints the loss of each and, per tensor, the relative difference
// of the gradients ||g_mixed - g_fp32|| / ||g_fp32|| (with the fraction of elements that are zero
// in the mixed gradient but not in fp32: gradients lost to f16 underflow). --loss-scales S,...
// runs the mixed model with its loss gradient multiplied by each S (a pass over dlogits appended
// to the loss ops, as a loss scaler does) and its gradients divided by S again: what loss scaling
// buys f16 operands whose gradients would underflow.
//
//   node bench/bench_mixed_parity.mjs .gpu/l12.json --batch 32 [--seq 256] [--loss-scales 1,1024,65536]
// Env: DAWN_NODE (Dawn's dawn.node; see gpu/README.md).

import fs from 'node:fs';
import { dawnContext, repo } from './dawn.mjs';

const { Model } = await import(`${repo}/static/js/engine/model.js`);
const { f32bits, grid1d, launch, uniformWords } = await import(`${repo}/static/js/engine/ops.js`);
const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const { layout } = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
const B = Number(opt('--batch', 8));
const T = Number(opt('--seq', layout.config.seq_len));
const V = layout.config.vocab_size;
const ctx = await dawnContext({ mixed: true });
const tokens = Uint32Array.from({ length: B * T }, (_, i) => (i * 7919 + 13) % V);
const targets = Uint32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % V);

const scales = opt('--loss-scales', '1,65536').split(',').map(Number);
const SCALE = `struct Dims { n4: u32, s: f32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = g.x + g.y * n.x * 256u;
  if (i < dims.n4) { x[i] = x[i] * dims.s; }
}`;
const scalePipe = await ctx.lib.pipelineOf(await ctx.lib.compile(SCALE, 'loss scale'), 'main');

const run = async (precision, S = 1) => {
  const model = new Model(ctx, layout, { precision });
  await model.init(0);
  if (S !== 1) {
    const plan = await model.plan(B, T);
    const n4 = (plan.N * V) / 4;
    plan.loss.push(launch(ctx.device, scalePipe, { dims: uniformWords(ctx.device, [n4, f32bits(S), 0, 0], 'S'),
      x: plan.acts.logits }, grid1d(Math.ceil(n4 / 256)), 'loss scale'));
  }
  const r = await model.lossAndGrads(tokens, targets, B, T);
  for (let i = 0; i < r.grads.length; i++) r.grads[i] /= S;
  model.destroy();
  return r;
};
const f = await run('fp32');
for (const S of scales) compare(await run('mixed', S), S);

function compare(m, S) {
  console.log(`${layout.preset ?? 'custom'} B ${B} T ${T}, mixed with loss scale ${S}: loss fp32 ${f.loss.toFixed(6)}  ` +
    `mixed ${m.loss.toFixed(6)}  diff ${(m.loss - f.loss).toExponential(2)}`);
  let worst = 0;
  let d2all = 0;
  let n2all = 0;
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
    d2all += d2;
    n2all += n2;
    worst = Math.max(worst, rel);
    console.log(`  ${p.name.padEnd(44)} |g| ${Math.sqrt(n2).toExponential(2)}  rel diff ${rel.toExponential(2)}` +
      `  zeroed ${(lost / p.numel * 100).toFixed(2)}%`);
  }
  console.log(`loss scale ${S}: worst per-tensor relative gradient difference ${worst.toExponential(2)}; ` +
    `all gradients ${Math.sqrt(d2all / n2all).toExponential(2)}\n`);
}
