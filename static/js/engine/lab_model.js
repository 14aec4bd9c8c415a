// Lab entries for the model: whole-model calls and one entry per kernel, so tests can hold
// each kernel against PyTorch. All arrays in and out are plain typed arrays.

import { readBuffer, storageBuffer } from './gpu.js';
import { Kernels, attentionDsNumel, gainPartialNumel, lossFloats } from './kernels.js';
import { weightGradPartNumel } from './matmul_tiles.js';
import { ropeTable } from './rope.js';
import { tokenBuckets } from './token_buckets.js';
import { createModel } from './model.js';
import { encodeOps, releaseOps } from './ops.js';

/**
 * Run one or more kernel ops on fresh buffers. `inputs` maps names to typed arrays (uploaded);
 * `outputs` maps names to a length (zero-filled) or a typed array (initial contents, for +=).
 * `build(buffers)` returns an op or a promise of ops. Resolves to {name: Float32Array} outputs.
 */
async function runOps(ctx, inputs, outputs, build) {
  const dev = ctx.device;
  const bufs = {};
  for (const [name, arr] of Object.entries(inputs)) {
    bufs[name] = storageBuffer(dev, arr.byteLength, { label: name, data: arr });
  }
  for (const [name, init] of Object.entries(outputs)) {
    const data = typeof init === 'number' ? null : init;
    bufs[name] = storageBuffer(dev, (data ? data.length : init) * 4, { label: name, data });
  }
  const ops = (await Promise.all([build(bufs)].flat())).flat();
  const enc = dev.createCommandEncoder();
  encodeOps(enc, ops);
  dev.queue.submit([enc.finish()]);
  const out = {};
  for (const name of Object.keys(outputs)) {
    out[name] = new Float32Array(await readBuffer(dev, bufs[name]));
  }
  for (const b of Object.values(bufs)) b.destroy();
  releaseOps(ops);
  return out;
}

export function labEntries(ctx) {
  const kernels = (opts) => new Kernels(ctx.device, ctx.lib,
    { maxHeadDim: ctx.modelLimits.max_head_dim, ...opts });
  const k = kernels({ software: ctx.software });
  // The kernels as either adapter kind runs them, where the two differ (the fp32 matmuls:
  // matmul_tiles.js matmulLaunch; the row attention: attention_direct.js; the norms' and the
  // loss's short rows: kernels.js rowLaunch): `adapter` 'gpu' or 'software'; left out, this
  // adapter's.
  const byAdapter = { gpu: kernels({ software: false }), software: kernels({ software: true }) };
  const ka = (adapter) => {
    if (adapter === undefined) return k;
    if (!Object.hasOwn(byAdapter, adapter)) {
      throw new Error(`adapter must be 'gpu' or 'software', got ${JSON.stringify(adapter)}`);
    }
    return byAdapter[adapter];
  };
  let mixedKernels = null;
  const km = () => (mixedKernels ??= kernels({ mixed: true }));
  const u32 = (a) => Uint32Array.from(a);
  const ops = {
    embed: ({ tokens, wte, N, C }) => runOps(ctx, { tokens: u32(tokens), wte }, { x: N * C },
      (b) => k.embed({ ...b, N, C })),
    embedBackward: ({ tokens, dx, N, C, V }) => runOps(ctx,
      { buckets: tokenBuckets(u32(tokens), V), dx }, { dwte: V * C },
      (b) => k.embedBackward({ ...b, N, C, V })),
    rmsnorm: ({ x, g, N, C, eps, adapter }) => runOps(ctx, { x, g }, { y: N * C, rstd: N },
      (b) => ka(adapter).rmsnorm({ ...b, N, C, eps })),
    rmsnormBackward: ({ dy, x, g, rstd, N, C, adapter }) => runOps(ctx, { dy, x, g, rstd },
      { dx: N * C, dg: C, part: gainPartialNumel(N, C) },
      (b) => [ka(adapter).rmsnormBackward({ ...b, N, C }), k.rmsnormBackwardGain({ ...b, N, C })]),
    linear: ({ x, w, M, N, K, adapter }) => runOps(ctx, { x, w }, { y: M * N },
      (b) => ka(adapter).linear({ ...b, M, N, K })),
    linearBackward: ({ dy, x, w, M, N, K, adapter }) => runOps(ctx, { dy, x, w },
      { dx: M * K, dw: N * K, part: Math.max(1, weightGradPartNumel(M, N, K)) },
      (b) => [ka(adapter).linearBackwardInput({ ...b, M, N, K }),
        ka(adapter).linearBackwardWeight({ ...b, M, N, K })]),
    // The mixed-precision linears (f16 operands, f32 accumulation: mma.js) where the adapter has
    // them (lab.info.mixed); forward, input and weight gradient of one shape at once.
    linearMixed: ({ x, w, dy, M, N, K }) => runOps(ctx, { x, w, dy },
      { y: M * N, dx: M * K, dw: N * K, part: Math.max(1, weightGradPartNumel(M, N, K, true)) },
      (b) => [km().linear({ x: b.x, w: b.w, y: b.y, M, N, K }),
        km().linearBackwardInput({ dy: b.dy, w: b.w, dx: b.dx, M, N, K }),
        km().linearBackwardWeight({ dy: b.dy, x: b.x, dw: b.dw, part: b.part, M, N, K })]),
    // Attention on the matrix units (mma_attention.js) where the adapter has them and the shape
    // fits (the mixed Kernels choose the fp32 kernels otherwise).
    attentionMixed: ({ qkv, B, T, H, D }) => runOps(ctx, { qkv },
      { y: B * T * H * D, lse: B * H * T }, (b) => km().attention({ ...b, B, T, H, D })),
    attentionBackwardMixed: ({ qkv, y, dy, lse, B, T, H, D, dsPath = true }) => runOps(ctx,
      { qkv, y, dy, lse },
      { delta: B * H * T, dqkv: B * T * 3 * H * D, ds: dsPath ? attentionDsNumel(B, T, H) : 4 },
      (b) => km().attentionBackward({ ...b, B, T, H, D })),
    rope: ({ qkv, B, T, H, D, theta, inverse = false }) => runOps(ctx,
      { table: ropeTable(T, D, theta) }, { qkv },
      (b) => k.rope({ ...b, N: B * T, T, H, D, inverse })),
    attention: ({ qkv, B, T, H, D, adapter }) => runOps(ctx, { qkv },
      { y: B * T * H * D, lse: B * H * T }, (b) => ka(adapter).attention({ ...b, B, T, H, D })),
    // dsPath false: a 4-float dS buffer, so the tiled kernels recompute the scores in dq (as on
    // an adapter that cannot bind the T x T buffer)
    attentionBackward: ({ qkv, y, dy, lse, B, T, H, D, dsPath = true, adapter }) => runOps(ctx,
      { qkv, y, dy, lse },
      { delta: B * H * T, dqkv: B * T * 3 * H * D, ds: dsPath ? attentionDsNumel(B, T, H) : 4 },
      (b) => ka(adapter).attentionBackward({ ...b, B, T, H, D })),
    swiglu: ({ gu, N, F }) => runOps(ctx, { gu }, { h: N * F }, (b) => k.swiglu({ ...b, N, F })),
    swigluBackward: ({ gu, dh, N, F }) => runOps(ctx, { gu, dh }, { dgu: N * 2 * F },
      (b) => k.swigluBackward({ ...b, N, F })),
    crossEntropy: ({ logits, targets, N, V, adapter }) => runOps(ctx, { targets: u32(targets) },
      { logits, losses: lossFloats(N) }, (b) => ka(adapter).crossEntropy({ ...b, N, V })),
  };

  return {
    ops,
    /** {preset} | {config} | {layout}, seed -> the engine's Model (see README.md) */
    async createModel({ preset, config, layout, seed = 0 }) {
      const table = layout ?? await ctx.getLayout({ preset, config });
      return createModel(ctx, table, { seed });
    },
  };
}
