// Tensor cores from WGSL: f16 subgroup-matrix matmuls (static/js/engine/mma.js) on a model's real shapes,
// beside the engine's fp32 kernels (kernels.js, as a step launches them) and cuBLAS fp32, TF32 and
// f16 (bench_matmul_torch.py --dtypes) on the same GPU, under Node + Dawn. Needs an adapter with
// shader-f16 and f16 subgroup-matrix configs: on NVIDIA's Vulkan driver, Dawn's toggle
// vulkan_enable_f16_on_nvidia (passed here). GPU time from timestamp queries, median of --iters.
//
// Operands are multiples of 1/256 in [-1, 1], exact in f16, so an f16-operand kernel with f32
// accumulation differs from the exact product only by f32 rounding: each candidate's output rows
// (the first 16, 16 in the middle, the last 16) are compared with a float64 product of the same
// operands (`err`: max |out - exact| / max |exact|).
//
//   PYTHONPATH=. python3 bench/bench_matmul_torch.py .gpu/l120.json:8 .gpu/l12.json:32 \
//     --dtypes fp32,tf32,fp16 --out mm.json
//   node bench/bench_matmul_f16.mjs .gpu/l120.json:8 .gpu/l12.json:32 --torch mm.json \
//     [--iters 10] [--variant-ids A,B] [--only fwd,dx,dW] [--toggles disable_robustness]
// Env: DAWN_NODE (Dawn's dawn.node; see gpu/README.md).

import fs from 'node:fs';
import { benchArgs } from './args.mjs';
import { dawnContext, repo, timeCandidates } from './dawn.mjs';
import { engineOps, stepShapes } from './matmul_shapes.mjs';
import { mmaPlan, mmaShader } from '../static/js/engine/mma.js';
import { mmaGemm, mmaSplit, mmaTile } from '../static/js/engine/mma_ops.js';

const argv = process.argv.slice(2);
const { opt, specs } = benchArgs(argv, ['--iters', '--only', '--torch', '--toggles', '--variant-ids']);
const iters = Number(opt('--iters', 10));
const only = opt('--only', 'fwd,dx,dW').split(',');
const torch = opt('--torch', null) ? JSON.parse(fs.readFileSync(opt('--torch'), 'utf8')) : {};
const cdiv = (a, b) => Math.ceil(a / b);

// Variants (mma_variants.json, shared with tint_spirv.py): sgm x sgn subgroups, tm x tn 16 x 16
// tiles each, bk deep slices, nbuf slice buffers (all within 32 KiB of workgroup memory, a common
// limit; the H200 offers 48 KiB under Dawn), pad halves per row, f32 or f16 input.
const VARIANTS = Object.entries(JSON.parse(fs.readFileSync(new URL('./mma_variants.json', import.meta.url), 'utf8')))
  .map(([id, v]) => ({ id, ...v }));
const variants = opt('--variant-ids', null)
  ? VARIANTS.filter((v) => opt('--variant-ids').split(',').includes(v.id)) : VARIANTS;
const describe = (p) => `${p.BM}x${p.BN} ${p.sgm}x${p.sgn}sg ${p.tm}x${p.tn}t k${p.bk} ` +
  `b${p.nbuf}${p.unroll ? 'u' : ''}${p.pad ? '' : ' pad0'} ${p.input}`;

const toggles = (opt('--toggles', '') || '').split(',').filter(Boolean);
const ctx = await dawnContext({ exactTimestamps: true, toggles, mixed: true });
const { device, lib } = ctx;
const { Kernels } = await import(`${repo}/static/js/engine/kernels.js`);
const { weightGradPartNumel } = await import(`${repo}/static/js/engine/matmul_tiles.js`);
const { grid1d, launch, uniformWords, encodeDispatch } = await import(`${repo}/static/js/engine/ops.js`);
const { readBuffer } = await import(`${repo}/static/js/engine/gpu.js`);
const kernels = new Kernels(device, lib, { maxHeadDim: 128 });
// The engine's mixed linears as a step launches them (`mixed`: mma_ops.js picks the tile, MMA_TILE
// or a smaller one; the shapes no tile fills run fp32 and show as `-`).
const mixedKernels = new Kernels(device, lib, { maxHeadDim: 128, mixed: true });
const configs = (ctx.adapter.info.subgroupMatrixConfigs ?? []).map((c) =>
  `${c.componentType}x${c.componentType}->${c.resultComponentType} M${c.M}N${c.N}K${c.K}`);
console.log(`bench_matmul_f16 on ${ctx.info.vendor} ${ctx.info.architecture} ${ctx.info.description}; ` +
  `toggles vulkan_enable_f16_on_nvidia${toggles.map((t) => `,${t}`).join('')}; subgroup sizes ${ctx.adapter.info.subgroupMinSize}-` +
  `${ctx.adapter.info.subgroupMaxSize}; workgroup memory ${ctx.limits.maxComputeWorkgroupStorageSize} B`);
console.log(`subgroup-matrix configs: ${configs.join(', ')}`);
console.log(`GPU ms per call (median of ${iters}), TFLOP/s; err = max |out - exact| / max |exact|`);
for (const v of variants) console.log(`  ${v.id.padEnd(3)} ${describe(mmaPlan(v))}`);

// Operand values: multiples of 1/256 in [-1, 1] (exact in f16), one pattern by element index.
function pattern(numel, seed) {
  const f32 = new Float32Array(numel);
  const f16 = new Uint16Array(numel);
  let s = seed >>> 0;
  for (let i = 0; i < numel; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    const j = (s >>> 8) % 513 - 256;
    f32[i] = j / 256;
    f16[i] = halfBits(j / 256);
  }
  return { f32, f16 };
}
function halfBits(x) {   // exact for the pattern's values (normal f16 numbers and zero)
  if (x === 0) return 0;
  const sign = x < 0 ? 0x8000 : 0;
  const ax = Math.abs(x);
  const e = Math.floor(Math.log2(ax));
  return sign | ((e + 15) << 10) | Math.round((ax / 2 ** e - 1) * 1024);
}
const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
function upload(typed) {
  const buf = device.createBuffer({ size: Math.ceil(typed.byteLength / 16) * 16, usage: STORAGE });
  const chunk = 1 << 24;
  for (let off = 0; off < typed.length; off += chunk) {
    device.queue.writeBuffer(buf, off * typed.BYTES_PER_ELEMENT, typed, off, Math.min(chunk, typed.length - off));
  }
  return buf;
}

/** A shape in GEMM terms (see mma.js) with its operand layouts. */
function gemmOf(s) {
  const { R, S, INNER, aT, bT } = mmaGemm(s.kind, s.M, s.N, s.K);
  return { Mg: R, Ng: S, Kg: INNER, aT, bT };
}

/** Exact C rows `rows` of the GEMM g from the host operands (float64). */
function exactRows(g, A, B, rows) {
  const { Mg, Ng, Kg, aT, bT } = g;
  const out = new Float64Array(rows.length * Ng);
  const arow = new Float64Array(Kg);
  rows.forEach((m, ri) => {
    for (let k = 0; k < Kg; k++) arow[k] = aT ? A[k * Mg + m] : A[m * Kg + k];
    for (let n = 0; n < Ng; n++) {
      let t = 0;
      if (bT) { const o = n * Kg; for (let k = 0; k < Kg; k++) t += arow[k] * B[o + k]; }
      else { for (let k = 0; k < Kg; k++) t += arow[k] * B[k * Ng + n]; }
      out[ri * Ng + n] = t;
    }
  });
  return out;
}

async function errOf(g, out, rows, exact) {
  let err = 0;
  let scale = 1e-30;
  for (let ri = 0; ri < rows.length; ri++) {
    const got = new Float32Array(await readBuffer(device, out, 4 * g.Ng, 4 * rows[ri] * g.Ng));
    for (let n = 0; n < g.Ng; n++) {
      const d = Math.abs(got[n] - exact[ri * g.Ng + n]);
      err = Number.isNaN(d) ? Infinity : Math.max(err, d);
      scale = Math.max(scale, Math.abs(exact[ri * g.Ng + n]));
    }
  }
  return err / scale;
}

async function runOnce(ops, out, bytes) {
  const enc = device.createCommandEncoder();
  enc.clearBuffer(out, 0, bytes);
  const pass = enc.beginComputePass();
  for (const op of ops) encodeDispatch(pass, op);
  pass.end();
  device.queue.submit([enc.finish()]);
  await device.queue.onSubmittedWorkDone();
}

const pipes = new Map();
async function mmaPipeline(v, aT, bT) {
  const key = `${v.id}|${aT}|${bT}`;
  if (!pipes.has(key)) {
    const t0 = performance.now();
    const shader = await lib.compile(mmaShader({ ...v, aT, bT }), `mma ${key}`);
    pipes.set(key, { pipe: await lib.pipelineOf(shader, 'main'), ms: performance.now() - t0 });
  }
  return pipes.get(key);
}
// Compile every variant for the layouts the shapes use first: a variant Tint or the driver rejects
// is reported and left out, not the end of the run.
const layoutsUsed = [...new Set(only.map((k) => JSON.stringify([gemmOf({ kind: k }).aT, gemmOf({ kind: k }).bT])))];
for (const v of [...variants]) {
  for (const l of layoutsUsed) {
    const [aT, bT] = JSON.parse(l);
    try {
      await mmaPipeline(v, aT, bT);
    } catch (e) {
      console.log(`variant ${v.id} (aT ${aT}, bT ${bT}) left out: ${String(e.message || e).slice(0, 2000)}`);
      variants.splice(variants.indexOf(v), 1);
      break;
    }
  }
}
// A split's partials are added into C as the engine adds them (C += their sum, fixed order).
const addPipe = await lib.pipeline('11_linear_backward.wgsl', 'add_partials', { WG: 256 }, ['mm', 'dy', 'out']);

/** Scratch floats for the split-K slabs of shape s (GEMM g): the engine's and every variant's. */
function partNumel(s, g) {
  const slabs = variants.map((v) => mmaSplit(g.Mg, g.Ng, g.Kg, true, mmaPlan({ ...v, aT: g.aT, bT: g.bT })).splits);
  return Math.max(4, s.kind === 'dW' ? weightGradPartNumel(s.M, s.N, s.K, true) : 0,
    Math.max(...slabs) * g.Mg * g.Ng);
}

async function mmaOps(v, g, bufs) {
  const p = mmaPlan({ ...v, aT: g.aT, bT: g.bT });
  const { fits, splits, KS } = mmaSplit(g.Mg, g.Ng, g.Kg, true, p);
  if (!fits) return null;
  const tiles = (g.Mg / p.BM) * (g.Ng / p.BN);
  const { pipe } = await mmaPipeline(v, g.aT, g.bT);
  const src = p.input === 'f16' ? { a: bufs.a16, b: bufs.b16 } : { a: bufs.a32, b: bufs.b32 };
  const dims = uniformWords(device, [g.Mg, g.Ng, g.Kg, KS], 'dims');
  const grid = [g.Ng / p.BN, g.Mg / p.BM, splits];
  if (splits === 1) return { tiles, splits, ops: [launch(device, pipe, { dims, ...src, c: bufs.c }, grid, v.id)] };
  return { tiles, splits, ops: [
    launch(device, pipe, { dims, ...src, c: bufs.part }, grid, v.id),
    launch(device, addPipe, { mm: uniformWords(device, [g.Mg, g.Ng, splits, 0], 'add'), dy: bufs.part,
      out: bufs.c }, grid1d(cdiv(g.Mg * g.Ng, 256)), 'add partials'),
  ] };
}


const tflops = (g, ms) => (2 * g.Mg * g.Ng * g.Kg) / (ms * 1e9);
const fmt = (ms, g) => (ms ? `${ms.toFixed(3).padStart(7)} ms ${tflops(g, ms).toFixed(1).padStart(5)}` : '      -          ');

for (const spec of specs) {
  const [file, bstr] = spec.split(':');
  const { layout } = JSON.parse(fs.readFileSync(file, 'utf8'));
  const cfg = layout.config;
  const rows = Number(bstr ?? 8) * cfg.seq_len;
  const preset = layout.preset ?? 'custom';
  const shapes = stepShapes(cfg, rows).filter((s) => only.includes(s.kind));
  const gs = shapes.map(gemmOf);
  const maxOf = (f) => Math.max(...gs.map(f));
  const A = pattern(maxOf((g) => g.Mg * g.Kg), 1);
  const B = pattern(maxOf((g) => g.Kg * g.Ng), 2);
  const bufs = { a32: upload(A.f32), a16: upload(A.f16), b32: upload(B.f32), b16: upload(B.f16),
    c: device.createBuffer({ size: 4 * maxOf((g) => g.Mg * g.Ng), usage: STORAGE }),
    part: device.createBuffer({ size: 4 * Math.max(...shapes.map((s, i) => partNumel(s, gs[i]))), usage: STORAGE }) };
  console.log(`\n${preset}  B ${bstr}  T ${cfg.seq_len}  (${rows} rows)`);
  const stepTotals = {};
  for (let si = 0; si < shapes.length; si++) {
    const s = shapes[si];
    const g = gs[si];
    const key = `${preset}:${rows}:${s.name}:${s.kind}`;
    const rowsChecked = [...Array(16).keys()].flatMap((i) => [i, g.Mg / 2 + i, g.Mg - 16 + i]);
    const exact = exactRows(g, A.f32, B.f32, rowsChecked);
    const cands = [{ id: 'fp32', ops: await engineOps(kernels, s, { x: s.kind === 'dW' ? bufs.b32 : bufs.a32,
      w: bufs.b32, dy: bufs.a32, y: bufs.c, dx: bufs.c, dw: bufs.c, part: bufs.part }) }];
    if (mmaTile(g.Mg, g.Ng, g.Kg)) {
      cands.push({ id: 'mixed', ops: await engineOps(mixedKernels, s, { x: s.kind === 'dW' ? bufs.b32 : bufs.a32,
        w: bufs.b32, dy: bufs.a32, y: bufs.c, dx: bufs.c, dw: bufs.c, part: bufs.part }) });
    }
    for (const v of variants) {
      const r = await mmaOps(v, g, bufs);
      if (r) cands.push({ id: v.id, ...r });
    }
    for (const c of cands) {
      await runOnce(c.ops, bufs.c, 4 * g.Mg * g.Ng);
      c.err = await errOf(g, bufs.c, rowsChecked, exact);
    }
    const ms = await timeCandidates(device, cands.map((c) => c.ops), iters);
    const t = { fp32: torch[key], tf32: torch[`${key}:tf32`], fp16: torch[`${key}:fp16`] };
    console.log(`${`${s.name} ${s.kind}`.padEnd(12)} [${g.Mg} x ${g.Ng}] x ${g.Kg}  x${s.calls}   ` +
      `cuBLAS fp32 ${fmt(t.fp32, g)}   tf32 ${fmt(t.tf32, g)}   f16 ${fmt(t.fp16, g)}`);
    for (const [id, tms] of Object.entries(t)) if (tms) (stepTotals[`cuBLAS ${id}`] ??= []).push(s.calls * tms);
    cands.forEach((c, i) => {
      (stepTotals[c.id] ??= []).push(s.calls * ms[i]);
      const split = c.splits > 1 ? `split ${c.splits}` : '';
      console.log(`    ${c.id.padEnd(4)} ${c.tiles ? `${String(c.tiles).padStart(5)} tiles ${split.padEnd(8)}` : `${''.padEnd(20)}`}` +
        `${fmt(ms[i], g)}   x fp32 ${(ms[0] / ms[i]).toFixed(2).padStart(5)}` +
        `${t.fp16 ? `   x cuBLAS f16 ${(t.fp16 / ms[i]).toFixed(2)}` : ''}   err ${c.err.toExponential(1)}` +
        `${c.err > 1e-4 ? '  WRONG' : ''}`);
    });
  }
  console.log(`${preset}: the matmuls of one step (sum of calls x ms, where a candidate ran every shape):`);
  const fp32 = stepTotals.fp32.reduce((a, x) => a + x, 0);
  for (const [id, list] of Object.entries(stepTotals)) {
    if (list.length !== shapes.length) continue;
    const tot = list.reduce((a, x) => a + x, 0);
    console.log(`  ${id.padEnd(12)} ${tot.toFixed(2).padStart(8)} ms   fp32 engine / this ${(fp32 / tot).toFixed(2)}`);
  }
  const best = shapes.reduce((a, _, i) => a + Math.min(...Object.entries(stepTotals)
    .filter(([id]) => !['fp32', 'mixed', 'cuBLAS fp32', 'cuBLAS tf32', 'cuBLAS fp16'].includes(id) && stepTotals[id][i] !== undefined)
    .map(([, list]) => list[i])), 0);
  console.log(`  best variant per shape ${best.toFixed(2).padStart(8)} ms   fp32 engine / this ${(fp32 / best).toFixed(2)}`);
  for (const b of Object.values(bufs)) b.destroy();
}
console.log('\npipeline creation (WGSL -> SPIR-V -> driver), ms:');
for (const [key, { ms }] of pipes) console.log(`  ${key.padEnd(10)} ${ms.toFixed(0)}`);
