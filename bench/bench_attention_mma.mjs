// Attention on the matrix units (static/js/engine/mma_attention.js) against the engine's fp32
// attention kernels, under Node + Dawn: per shape, the GPU time of the forward and of the
// backward (delta, dq, dk/dv) side by side in one run. Their results are held against torch by
// tests/unit/gpu/test_mixed_kernels.py (in the browser on the GPU: bench/gpu/e2e.sh).
//
//   node bench/bench_attention_mma.mjs [--iters 20]
// Env: DAWN_NODE (Dawn's dawn.node; see gpu/README.md).

import { dawnContext, repo, timeCandidates } from './dawn.mjs';

const { Kernels, attentionDsNumel } = await import(`${repo}/static/js/engine/kernels.js`);
const { storageBuffer } = await import(`${repo}/static/js/engine/gpu.js`);
const { releaseOps } = await import(`${repo}/static/js/engine/ops.js`);

const argv = process.argv.slice(2);
const iters = argv.includes('--iters') ? Number(argv[argv.indexOf('--iters') + 1]) : 20;
const ctx = await dawnContext({ mixed: true, exactTimestamps: true });
const dev = ctx.device;
const k32 = new Kernels(dev, ctx.lib, { maxHeadDim: 128 });
const kmx = new Kernels(dev, ctx.lib, { maxHeadDim: 128, mixed: true });

let seed = 1;
const rand = () => {   // uniform (0, 1), deterministic
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return (seed + 0.5) / 2147483648;
};
const randn = (n, s = 1) => Float32Array.from({ length: n },
  () => s * Math.sqrt(-2 * Math.log(rand())) * Math.cos(2 * Math.PI * rand()));

async function run(kernels, { qkv, dy }, B, T, H, D) {
  const C = H * D;
  const buf = (data, n) => storageBuffer(dev, 4 * (data ? data.length : n), { data });
  const b = { qkv: buf(qkv), dy: buf(dy), y: buf(null, B * T * C), lse: buf(null, B * H * T),
    delta: buf(null, B * H * T), dqkv: buf(null, B * T * 3 * C),
    ds: buf(null, attentionDsNumel(B, T, H, kernels.mixed ? D : 0)) };   // as the model sizes it
  const fwd = [await kernels.attention({ qkv: b.qkv, y: b.y, lse: b.lse, B, T, H, D })];
  const bwd = (await kernels.attentionBackward({ qkv: b.qkv, y: b.y, dy: b.dy, lse: b.lse,
    delta: b.delta, dqkv: b.dqkv, ds: b.ds, B, T, H, D })).flat();
  return { fwd, bwd, free: () => { releaseOps([...fwd, ...bwd]); Object.values(b).forEach((x) => x.destroy()); } };
}

console.log('GPU ms (median of timestamped rounds): fp32 kernels vs matrix units');
for (const [name, B, T, H, D] of [['12m B32', 32, 256, 6, 64], ['120m B8', 8, 1024, 12, 64]]) {
  const C = H * D;
  const inp = { qkv: randn(B * T * 3 * C), dy: randn(B * T * C) };
  const fp = await run(k32, inp, B, T, H, D);
  const mx = await run(kmx, inp, B, T, H, D);
  const [f1, m1, f2, m2] = await timeCandidates(dev, [fp.fwd, mx.fwd, fp.bwd, mx.bwd], iters);
  const per = await timeCandidates(dev, mx.bwd.map((o) => [o]), iters);
  console.log(`${name}: forward ${f1.toFixed(3)} -> ${m1.toFixed(3)} (${(f1 / m1).toFixed(2)}x)  ` +
    `backward ${f2.toFixed(3)} -> ${m2.toFixed(3)} (${(f2 / m2).toFixed(2)}x)  [mixed backward: ` +
    `${mx.bwd.map((o, i) => `${o.entry} ${per[i].toFixed(3)}`).join(', ')}]`);
  fp.free();
  mx.free();
}
