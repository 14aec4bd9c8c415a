// Attention on the matrix units (static/js/engine/mma_attention.js) against the engine's fp32
// attention kernels, under Node + Dawn: per shape, the GPU time of the forward and of the
// backward (delta, dq, dk/dv) side by side in one run, and, where --check, each output's largest
// error against a float64 reference on the f16-rounded q, k, v and dO, as a multiple of the
// rounding bound 2^-11 * (|A| @ |B|) of the product it comes from (P v, P^T dO, dS k, dS^T q).
//
//   node bench/bench_attention_mma.mjs [--check] [--iters 20]
// Env: DAWN_NODE (Dawn's dawn.node; see gpu/README.md).

import { dawnContext, repo, timeCandidates } from './dawn.mjs';

const { Kernels, attentionDsNumel } = await import(`${repo}/static/js/engine/kernels.js`);
const { readBuffer, storageBuffer } = await import(`${repo}/static/js/engine/gpu.js`);
const { encodeOps, releaseOps } = await import(`${repo}/static/js/engine/ops.js`);

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

/** x rounded to the nearest f16 (ties to even), as a double. */
function f16(x) {
  const a = Math.abs(x);
  if (a === 0) return x;
  const e = Math.max(Math.floor(Math.log2(a)), -14);
  const ulp = 2 ** (e - 10);
  const r = a / ulp;
  const fl = Math.floor(r);
  const d = r - fl;
  const q = d > 0.5 || (d === 0.5 && fl % 2 === 1) ? fl + 1 : fl;
  return Math.sign(x) * q * ulp;
}

/** Float64 reference on f16-rounded inputs, and the rounding bounds of each output. */
function reference(qkv, dy, B, T, H, D) {
  const C = H * D;
  const sc = 1 / Math.sqrt(D);
  const at = (t, part, h, d) => f16(qkv[t * 3 * C + part * C + h * D + d]);
  const y = new Float64Array(B * T * C);
  const lse = new Float64Array(B * H * T);
  const dqkv = new Float64Array(B * T * 3 * C);
  const by = new Float64Array(B * T * C);      // bound of y: |P| @ |v|
  const bdqkv = new Float64Array(B * T * 3 * C);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const P = [];
      for (let t = 0; t < T; t++) {
        const row = b * T + t;
        const s = [];
        for (let j = 0; j <= t; j++) {
          let acc = 0;
          for (let d = 0; d < D; d++) acc += at(row, 0, h, d) * at(b * T + j, 1, h, d);
          s.push(acc * sc);
        }
        const m = Math.max(...s);
        const l = s.reduce((a, x) => a + Math.exp(x - m), 0);
        lse[(b * H + h) * T + t] = m + Math.log(l);
        const p = s.map((x) => Math.exp(x - m) / l);
        P.push(p);
        for (let d = 0; d < D; d++) {
          let acc = 0;
          let bnd = 0;
          for (let j = 0; j <= t; j++) {
            const v = at(b * T + j, 2, h, d);
            acc += p[j] * v;
            bnd += p[j] * Math.abs(v);
          }
          y[row * C + h * D + d] = acc;
          by[row * C + h * D + d] = bnd;
        }
      }
      // backward: dO rounded to f16 (delta = dO . y from the unrounded dO, as the kernels take it)
      const dO = (t, d) => f16(dy[(b * T + t) * C + h * D + d]);
      const dS = [];
      for (let t = 0; t < T; t++) {
        let delta = 0;
        for (let d = 0; d < D; d++) delta += dy[(b * T + t) * C + h * D + d] * y[(b * T + t) * C + h * D + d];
        dS.push(P[t].map((p, j) => {
          let dp = 0;
          for (let d = 0; d < D; d++) dp += dO(t, d) * at(b * T + j, 2, h, d);
          return p * (dp - delta);
        }));
      }
      for (let t = 0; t < T; t++) {
        for (let d = 0; d < D; d++) {
          let dq = 0;
          let bq = 0;
          for (let j = 0; j <= t; j++) {
            const kk = at(b * T + j, 1, h, d);
            dq += dS[t][j] * kk;
            bq += Math.abs(dS[t][j] * kk);
          }
          const o = (b * T + t) * 3 * C + h * D + d;
          dqkv[o] = sc * dq;
          bdqkv[o] = sc * bq;
        }
      }
      for (let j = 0; j < T; j++) {
        for (let d = 0; d < D; d++) {
          let dk = 0;
          let bk = 0;
          let dv = 0;
          let bv = 0;
          for (let t = j; t < T; t++) {
            const q = at(b * T + t, 0, h, d);
            dk += dS[t][j] * q;
            bk += Math.abs(dS[t][j] * q);
            dv += P[t][j] * dO(t, d);
            bv += Math.abs(P[t][j] * dO(t, d));
          }
          const o = (b * T + j) * 3 * C + h * D + d;
          dqkv[o + C] = sc * dk;
          bdqkv[o + C] = sc * bk;
          dqkv[o + 2 * C] = dv;
          bdqkv[o + 2 * C] = bv;
        }
      }
    }
  }
  return { y, lse, dqkv, by, bdqkv };
}

async function run(kernels, { qkv, dy, y }, B, T, H, D, dsPath = true) {
  const C = H * D;
  const buf = (data, n) => storageBuffer(dev, 4 * (data ? data.length : n), { data });
  const b = { qkv: buf(qkv), dy: buf(dy), y: buf(null, B * T * C), lse: buf(null, B * H * T),
    yin: buf(y ?? new Float32Array(B * T * C)), delta: buf(null, B * H * T),
    dqkv: buf(null, B * T * 3 * C), ds: buf(null, dsPath ? attentionDsNumel(B, T, H) : 4) };
  const fwd = [await kernels.attention({ qkv: b.qkv, y: b.y, lse: b.lse, B, T, H, D })];
  const bwd = (await kernels.attentionBackward({ qkv: b.qkv, y: y ? b.yin : b.y, dy: b.dy,
    lse: b.lse, delta: b.delta, dqkv: b.dqkv, ds: b.ds, B, T, H, D })).flat();
  const enc = dev.createCommandEncoder();
  encodeOps(enc, [...fwd, ...bwd]);
  dev.queue.submit([enc.finish()]);
  const out = {};
  for (const n of ['y', 'lse', 'dqkv']) out[n] = new Float32Array(await readBuffer(dev, b[n]));
  return { out, fwd, bwd, free: () => { releaseOps([...fwd, ...bwd]); Object.values(b).forEach((x) => x.destroy()); } };
}

const U16 = 2 ** -11;
function worst(got, ref, bnd, from = 0, step = 1, len = ref.length) {
  let r = 0;
  let e = 0;
  let big = 0;
  for (let i = 0; i < ref.length; i++) big = Math.max(big, Math.abs(ref[i]));
  for (let i = from; i < len; i += step) {
    const err = Math.abs(got[i] - ref[i]);
    e = Math.max(e, err);
    // (an f32 rounding of the largest output on top: where dS cancels to 0, its bound is 0)
    if (bnd) r = Math.max(r, err / (U16 * bnd[i] + 2 ** -24 * big));
  }
  return { err: e, ratio: r };
}

if (argv.includes('--check')) {
  for (const [B, T, H, D] of [[2, 128, 2, 64], [1, 64, 3, 16], [1, 192, 2, 32], [1, 128, 1, 48]]) {
    const C = H * D;
    const qkv = randn(B * T * 3 * C);
    const dy = randn(B * T * C);
    const ref = reference(qkv, dy, B, T, H, D);
    const mx = await run(kmx, { qkv, dy, y: Float32Array.from(ref.y) }, B, T, H, D);
    const fp = await run(k32, { qkv, dy, y: Float32Array.from(ref.y) }, B, T, H, D);
    // dS through memory or recomputed in dq: the same bits
    const again = await run(kmx, { qkv, dy, y: Float32Array.from(ref.y) }, B, T, H, D, false);
    const same = again.out.dqkv.every((x, i) => Object.is(x, mx.out.dqkv[i]));
    again.free();
    const parts = { dq: 0, dk: 1, dv: 2 };
    const line = [`B${B} T${T} H${H} D${D} ops ${mx.fwd.map((o) => o.file).join(',')} + ${mx.bwd.map((o) => o.entry).join(',')}; ` +
      `dqkv with dS recomputed ${same ? 'identical' : 'DIFFERENT'} (${again.bwd.map((o) => o.entry).join(',')})`];
    for (const [name, k] of [['mixed', mx], ['fp32 ', fp]]) {
      const w = worst(k.out.y, ref.y, ref.by);
      const wl = worst(k.out.lse, ref.lse, null);
      const s = [`${name}: y err ${w.err.toExponential(2)} (x${w.ratio.toFixed(3)} bound)  lse ${wl.err.toExponential(2)}`];
      for (const [p, off] of Object.entries(parts)) {
        let e = 0;
        let r = 0;
        for (let row = 0; row < B * T; row++) {
          const ww = worst(k.out.dqkv, ref.dqkv, ref.bdqkv, row * 3 * C + off * C, 1, row * 3 * C + (off + 1) * C);
          e = Math.max(e, ww.err);
          r = Math.max(r, ww.ratio);
        }
        s.push(`${p} ${e.toExponential(2)} (x${r.toFixed(3)})`);
      }
      line.push(s.join('  '));
    }
    console.log(line.join('\n  '));
    mx.free();
    fp.free();
  }
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
