// The engine's fp32 matmul kernels (03_linear.wgsl, 11_linear_backward.wgsl over
// lib/matmul_core.wgsl) on a model's real shapes, under Node + Dawn, beside torch.matmul
// (bench_matmul_torch.py, TF32 off) on the same GPU. For each of the five linears of a layer (q|k|v,
// o, gate|up, down, lm head) it times the forward y = x W^T, the input gradient dx = dy W and the
// weight gradient dW = dy^T x, each as the engine launches it (kernels.js: `engine`) and, with
// --variants, as each tile shape in VARIANTS (weight gradients with and without split-K).
// GPU time per dispatch from timestamp-query (quantization off), median of --iters.
// Every variant's output is compared with the engine's small tile (`small`): max |diff| / max |ref|.
//
//   PYTHONPATH=. python3 bench/bench_matmul_torch.py .gpu/l120.json:8 .gpu/l12.json:32 \
//     --out mm.json
//   node bench/bench_matmul.mjs .gpu/l120.json:8 .gpu/l12.json:32 --torch mm.json \
//     [--iters 10] [--variants] [--variant-ids small16,w16x8k8] [--only fwd,dx,dW] [--diag]
//     [--toggles disable_robustness]
// The candidates of a shape run round-robin in one submission after ~200 ms of untimed rounds
// (clocks ramped up, the same for all). --diag: ceilings on the 120m q|k|v forward (see diag()).
// Env: DAWN_NODE (Dawn's dawn.node; see gpu/README.md).

import fs from 'node:fs';
import { benchArgs } from './args.mjs';
import { dawnContext, repo, timeCandidates } from './dawn.mjs';
import { engineOps, stepShapes } from './matmul_shapes.mjs';

const { Kernels } = await import(`${repo}/static/js/engine/kernels.js`);
const { weightGradSplit } = await import(`${repo}/static/js/engine/matmul_tiles.js`);
const { grid1d, launch, uniformWords, encodeDispatch } = await import(`${repo}/static/js/engine/ops.js`);
const { readBuffer } = await import(`${repo}/static/js/engine/gpu.js`);

const argv = process.argv.slice(2);
const { opt, specs } = benchArgs(argv, ['--iters', '--only', '--torch', '--toggles', '--variant-ids']);
const iters = Number(opt('--iters', 10));
const withVariants = argv.includes('--variants');
const only = opt('--only', 'fwd,dx,dW').split(',');
const torch = opt('--torch', null) ? JSON.parse(fs.readFileSync(opt('--torch'), 'utf8')) : {};
const cdiv = (a, b) => Math.ceil(a / b);

// Tile variants: small = matmul_tile with TG x TG threads (4x4 each); wide = matmul_wide with
// WX x WY threads (8x8 each), BK the reduction step.
const VARIANTS = [
  { id: 'small16', entry: 'main', TG: 16, BK: 16 },
  { id: 'w16x16k8', entry: 'main_wide', WX: 16, WY: 16, BK: 8 },
  { id: 'w8x16k8', entry: 'main_wide', WX: 8, WY: 16, BK: 8 },
  { id: 'w16x8k8', entry: 'main_wide', WX: 16, WY: 8, BK: 8 },
];
const variants = opt('--variant-ids', null)
  ? VARIANTS.filter((v) => opt('--variant-ids').split(',').includes(v.id)) : VARIANTS;
const tileOf = (v) => (v.entry === 'main' ? [4 * v.TG, 4 * v.TG] : [8 * v.WY, 8 * v.WX]);
const constsOf = (v) => (v.entry === 'main' ? { TG: v.TG, BK: v.BK } : { WX: v.WX, WY: v.WY });

// --toggles a,b: extra Dawn toggles (e.g. disable_robustness, to see what bounds clamps cost).
const toggles = opt('--toggles', '');
const ctx = await dawnContext({ exactTimestamps: true, toggles: toggles ? toggles.split(',') : [] });
const { device, lib } = ctx;
const kernels = new Kernels(device, lib, { maxHeadDim: 128, software: ctx.software });
const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.description].filter(Boolean).join(' ');

const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
function randomBuffer(numel, seed) {
  const buf = device.createBuffer({ size: 4 * numel, usage: STORAGE });
  const chunk = 1 << 22;
  const data = new Float32Array(Math.min(numel, chunk));
  let s = seed >>> 0;
  for (let i = 0; i < data.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    data[i] = (s / 2 ** 32 - 0.5) * 2;
  }
  for (let off = 0; off < numel; off += chunk) {
    const n = Math.min(chunk, numel - off);
    device.queue.writeBuffer(buf, 4 * off, data, 0, n);
  }
  return buf;
}

/** ops (list) of one variant for one shape; split: splits of a weight gradient (1: MODE 1). */
async function variantOps(v, s, bufs, splits) {
  const { M, N, K } = s;
  const [tr, ts] = tileOf(v);
  const c = constsOf(v);
  // res: the buffers by their WGSL names (mm, the uniform, is added here)
  const op = async (file, entry, constants, dims, res, grid) => {
    const p = await lib.pipeline(file, entry, constants, ['mm', ...Object.keys(res)]);
    return launch(device, p, { mm: uniformWords(device, dims, 'dims'), ...res }, grid, s.kind);
  };
  if (s.kind === 'fwd') {
    return [await op('03_linear.wgsl', v.entry, { ACCUM: 0, W_F16: 0, ...c }, [M, N, K, 0],
      { x: bufs.x, w: bufs.w, y: bufs.y }, [cdiv(N, ts), cdiv(M, tr)])];
  }
  if (s.kind === 'dx') {
    return [await op('11_linear_backward.wgsl', v.entry, { MODE: 0, W_F16: 0, ...c }, [M, K, N, 0],
      { dy: bufs.dy, w: bufs.w, out: bufs.dx }, [cdiv(K, ts), cdiv(M, tr)])];
  }
  if (splits === 1) {
    return [await op('11_linear_backward.wgsl', v.entry, { MODE: 1, ...c }, [N, K, M, 0],
      { dy: bufs.dy, w: bufs.x, out: bufs.dw }, [cdiv(K, ts), cdiv(N, tr)])];
  }
  const rows = cdiv(cdiv(M, splits), 16) * 16;
  const z = cdiv(M, rows);
  return [
    await op('11_linear_backward.wgsl', v.entry, { MODE: 2, ...c }, [N, K, M, rows],
      { dy: bufs.dy, w: bufs.x, out: bufs.part }, [cdiv(K, ts), cdiv(N, tr), z]),
    await op('11_linear_backward.wgsl', 'add_partials', { WG: 256 }, [N, K, z, 0],
      { dy: bufs.part, out: bufs.dw }, grid1d(cdiv(N * K, 256))),
  ];
}


const timeCands = (cands) => timeCandidates(device, cands, iters);

/** Output of `ops` run once from a zeroed output buffer, as a Float32Array. */
async function runOnce(ops, out, numel) {
  const enc = device.createCommandEncoder();
  enc.clearBuffer(out, 0, 4 * numel);
  const pass = enc.beginComputePass();
  for (const op of ops) encodeDispatch(pass, op);
  pass.end();
  device.queue.submit([enc.finish()]);
  return new Float32Array(await readBuffer(device, out, 4 * numel));
}

function compare(got, ref) {
  let err = 0;
  let scale = 1e-30;
  let same = true;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs(got[i] - ref[i]);
    if (!(d <= err)) err = Number.isNaN(d) ? Infinity : Math.max(err, d);
    if (got[i] !== ref[i]) same = false;
    scale = Math.max(scale, Math.abs(ref[i]));
  }
  return same ? 'same bits' : `rel ${(err / scale).toExponential(1)}`;
}

const tflops = (s, ms) => (2 * s.M * s.N * s.K) / (ms * 1e9);
const fmt = (ms, s) => `${ms.toFixed(3).padStart(7)} ms ${tflops(s, ms).toFixed(1).padStart(5)}`;

console.log(`bench_matmul on ${adapter}; GPU ms per call (median of ${iters}), TFLOP/s`);

// --diag: ceilings of the forward kernel on the 120m q|k|v shape, from edited copies of its WGSL
// (bench-only): without global loads (load_a / load_b return a function of the index), with
// another warp layout of the wide tile, and a register-only FMA loop (the FMA peak under Dawn).
async function diag() {
  const s = argv.includes('--diag-small') ? { name: 'qkv', kind: 'fwd', M: 256, N: 256, K: 64 }
    : { name: 'qkv', kind: 'fwd', M: 8192, N: 2304, K: 768 };
  const src = await lib.source('03_linear.wgsl');
  const noGlobal = (t) => t.replace('return x[i * mm.INNER + r];', 'return f32(r & 7u) * 0.5;')
    .replace('return load_w(j * mm.INNER + r);', 'return f32(j & 3u) * 0.25;');
  const warp16 = (t) => t.replace('let tx = l % 8u + 8u * (w % (WX / 8u));', 'let tx = t % WX;')
    .replace('let ty = l / 8u + 4u * (w / (WX / 8u));', 'let ty = t / WX;');
  const noCheck = (t) => t.replace('if (i >= mm.R || r >= mm.INNER) { return 0.0; }', '')
    .replace('if (r >= mm.INNER || j >= mm.S) { return 0.0; }', '');
  const y = device.createBuffer({ size: 4 * s.M * s.N, usage: STORAGE });
  const x = randomBuffer(s.M * s.K, 1);
  const w = randomBuffer(s.N * s.K, 2);
  const cands = [];
  const add = async (id, code, entry, consts, tr, ts, global) => {
    const pipe = await lib.pipelineOf(await lib.compile(code, id), entry,
      { ACCUM: 0, W_F16: 0, ...consts }, global ? ['mm', 'x', 'w', 'y'] : ['mm', 'y']);
    const mm = uniformWords(device, [s.M, s.N, s.K, 0], 'dims');
    cands.push({ id, ops: [launch(device, pipe, global ? { mm, x, w, y } : { mm, y },
      [cdiv(s.N, ts), cdiv(s.M, tr)], id)] });
  };
  const W168 = { WX: 16, WY: 8 };
  const W1616 = { WX: 16, WY: 16 };
  await add('small16', src, 'main', { TG: 16, BK: 16 }, 64, 64, true);
  await add('small16 no global', noGlobal(src), 'main', { TG: 16, BK: 16 }, 64, 64, false);
  await add('w16x8k8', src, 'main_wide', W168, 64, 128, true);
  await add('w16x8k8 no global', noGlobal(src), 'main_wide', W168, 64, 128, false);
  await add('w16x8k8 warp 16x2', warp16(src), 'main_wide', W168, 64, 128, true);
  await add('w16x8k8 warp 16x2 no global', warp16(noGlobal(src)), 'main_wide', W168, 64, 128, false);
  await add('w16x8k8 no bounds checks', noCheck(src), 'main_wide', W168, 64, 128, true);
  await add('w16x16k8', src, 'main_wide', W1616, 128, 128, true);
  await add('w16x16k8 no global', noGlobal(src), 'main_wide', W1616, 128, 128, false);
  const ms = await timeCands(cands.map((c) => c.ops));
  console.log(`diag: 03_linear on [${s.M} x ${s.N}] x ${s.K}`);
  cands.forEach((c, i) => console.log(`  ${c.id.padEnd(30)} ${fmt(ms[i], s)}`));
  // FMA peak: 16 vec4 accumulators, 64 FMAs per iteration from registers.
  const iters = 4096;
  const body = [];
  for (let n = 0; n < 8; n++) {
    const a = n < 4 ? 'a0' : 'a1';
    const c = 'xyzw'[n % 4];
    body.push(`c${n}a = fma(vec4<f32>(${a}.${c}), b0, c${n}a); c${n}b = fma(vec4<f32>(${a}.${c}), b1, c${n}b);`);
  }
  const code = `@group(0) @binding(0) var<storage, read_write> out: array<vec4<f32>>;
@compute @workgroup_size(128)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let s = f32(gid.x) * 1e-9;
  let a0 = vec4<f32>(s, s + 1.0, s + 2.0, s + 3.0); let a1 = a0 + 0.5;
  let b0 = vec4<f32>(0.999, 0.998, 0.997, 0.996) + s; let b1 = b0 - 0.5;
  ${[...Array(8).keys()].map((n) => `var c${n}a = vec4<f32>(0.0); var c${n}b = vec4<f32>(0.0);`).join('\n  ')}
  for (var i = 0u; i < ${iters}u; i = i + 1u) {
    ${body.join('\n    ')}
  }
  out[gid.x] = ${[...Array(8).keys()].map((n) => `c${n}a + c${n}b`).join(' + ')};
}`;
  const pipe = await lib.pipelineOf(await lib.compile(code, 'fma'), 'main');
  const groups = argv.includes('--diag-small') ? 4 : 132 * 32;
  const out = device.createBuffer({ size: 16 * 128 * groups, usage: STORAGE });
  const op = launch(device, pipe, { out }, [groups], 'fma');
  const [fms] = await timeCands([[op]]);
  const flop = 128 * groups * iters * 64 * 2;
  console.log(`  register FMA loop: ${fms.toFixed(3)} ms, ${(flop / fms / 1e9).toFixed(1)} TFLOP/s`);
}
if (argv.includes('--diag')) await diag();
for (const spec of specs) {
  const [file, bstr] = spec.split(':');
  const { layout } = JSON.parse(fs.readFileSync(file, 'utf8'));
  const cfg = layout.config;
  const B = Number(bstr ?? 8);
  const rows = B * cfg.seq_len;
  const preset = layout.preset ?? 'custom';
  const shapes = stepShapes(cfg, rows).filter((s) => only.includes(s.kind));
  const maxOf = (f) => Math.max(...shapes.map(f));
  const bufs = {
    x: randomBuffer(maxOf((s) => s.M * s.K), 1),
    w: randomBuffer(maxOf((s) => s.N * s.K), 2),
    dy: randomBuffer(maxOf((s) => s.M * s.N), 3),
    y: device.createBuffer({ size: 4 * maxOf((s) => s.M * s.N), usage: STORAGE }),
    dx: device.createBuffer({ size: 4 * maxOf((s) => s.M * s.K), usage: STORAGE }),
    dw: device.createBuffer({ size: 4 * maxOf((s) => s.N * s.K), usage: STORAGE }),
  };
  // Split-K scratch: enough for the largest split any variant uses (64 parts at most).
  bufs.part = device.createBuffer({ size: 4 * Math.min(maxOf((s) => 64 * s.N * s.K), 2 ** 29),
    usage: STORAGE });
  console.log(`\n${preset}  B ${B}  T ${cfg.seq_len}  (M = ${rows} rows)`);
  let engTotal = 0;
  let torchTotal = 0;
  for (const s of shapes) {
    const outBuf = s.kind === 'fwd' ? bufs.y : s.kind === 'dx' ? bufs.dx : bufs.dw;
    const outNumel = s.kind === 'fwd' ? s.M * s.N : s.kind === 'dx' ? s.M * s.K : s.N * s.K;
    const [R, S, inner] = s.kind === 'fwd' ? [s.M, s.N, s.K] : s.kind === 'dx' ? [s.M, s.K, s.N]
      : [s.N, s.K, s.M];
    const key = `${preset}:${rows}:${s.name}:${s.kind}`;
    const tms = torch[key];
    const cands = [{ id: 'engine', ops: await engineOps(kernels, s, bufs) }];
    if (withVariants) {
      for (const v of variants) {
        const [tr, ts] = tileOf(v);
        const tiles = cdiv(R, tr) * cdiv(S, ts);
        let splitList = [1];
        if (s.kind === 'dW') {
          splitList = [...new Set([1, ...[264, 528, 1056].map((target) => Math.max(1,
            Math.min(Math.floor(target / tiles), Math.floor(inner / 256), 64)))])];
        }
        for (const splits of splitList) {
          cands.push({ id: v.id, tiles, splits, ops: await variantOps(v, s, bufs, splits) });
        }
      }
      const ref = await runOnce(await variantOps(VARIANTS[0], s, bufs, 1), outBuf, outNumel);
      for (const c of cands) c.check = compare(await runOnce(c.ops, outBuf, outNumel), ref);
    }
    const ms = await timeCands(cands.map((c) => c.ops));
    const engMs = ms[0];
    engTotal += s.calls * engMs;
    if (tms) torchTotal += s.calls * tms;
    let engNote = '';
    if (s.kind === 'dW') engNote = ` splits ${weightGradSplit(s.M, s.N, s.K).splits}`;
    console.log(`${`${s.name} ${s.kind}`.padEnd(13)} [${R} x ${S}] x ${String(inner).padEnd(5)} ` +
      `x${String(s.calls).padEnd(3)} engine ${fmt(engMs, s)}` +
      (tms ? `   torch ${fmt(tms, s)}   torch/engine ${(tms / engMs).toFixed(2)}` : '') + engNote +
      (cands[0].check ? `   vs small16: ${cands[0].check}` : ''));
    cands.slice(1).forEach((c, i) => {
      console.log(`    ${c.id.padEnd(10)} ${String(c.tiles).padStart(5)} tiles ` +
        `${s.kind === 'dW' ? `split ${String(c.splits).padEnd(3)}` : '         '} ${fmt(ms[i + 1], s)}` +
        `${tms ? `  torch/this ${(tms / ms[i + 1]).toFixed(2)}` : ''}   ${c.check}`);
    });
  }
  console.log(`${preset}: matmuls of one step (calls x ms): engine ${engTotal.toFixed(2)} ms` +
    (torchTotal ? `, torch ${torchTotal.toFixed(2)} ms, torch/engine ${(torchTotal / engTotal).toFixed(2)}` : ''));
  for (const b of Object.values(bufs)) b.destroy();
}
