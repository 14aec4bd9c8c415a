// The optimizer phase (global grad norm + AdamW) of the engine under Node + Dawn, per variant,
// timed on the GPU with timestamp queries (wall clock where the adapter has none).
//
//   python -m andrea.optim 120m > /tmp/layout_120m.json        # layout + maps (pure Python)
//   node bench/bench_optimizer.mjs /tmp/layout_120m.json [--iters 30] [--variants adamw,...]
//        [--torch torch.json] [--out table.txt] [--tune] [--tuning '{"bpw": 2}']
// Env: DAWN_NODE (Dawn's dawn.node; see bench/README.md). --torch merges the numbers
// of bench/bench_optimizer_torch.py (same GPU, same run) into the table; --tune also times a few
// 8-bit kernel shapes. Grads are refreshed from a copy before every step (outside the timing),
// so each step sees real gradients; timings are medians over --iters steps after warm-up.

import fs from 'node:fs';
import { dawnContext, repo } from './dawn.mjs';

const { Optimizer } = await import(`${repo}/static/js/engine/optimizer.js`);

function parseArgs(argv) {
  const a = { file: null, iters: 30, variants: 'adamw,adamw_f16,adamw_8bit,adamw_8bit_f16', torch: null,
    out: null, tune: false, tuning: {} };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    if (k === '--iters') a.iters = Number(argv[++i]);
    else if (k === '--variants') a.variants = argv[++i];
    else if (k === '--torch') a.torch = argv[++i];
    else if (k === '--out') a.out = argv[++i];
    else if (k === '--tune') a.tune = true;
    else if (k === '--tuning') a.tuning = JSON.parse(argv[++i]);
    else a.file = k;
  }
  if (!a.file) throw new Error('usage: node bench/bench_optimizer.mjs layout.json [--iters N] [--torch t.json] [--out f]');
  return a;
}

const args = parseArgs(process.argv.slice(2));
const { layout, maps } = JSON.parse(fs.readFileSync(args.file, 'utf8'));
const ctx = await dawnContext({ exactTimestamps: true });
const { device } = ctx;
const hasTs = ctx.features.includes('timestamp-query');
const N = layout.total_numel;
const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.device, ctx.info.description]
  .filter(Boolean).join(' ');

// Random weights and gradients, generated on the host once (a simple LCG; values do not matter
// for speed, but they keep every code path of the 8-bit kernel busy).
function randomF32(n, scale, seed) {
  const out = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = ((s >>> 8) / 16777216 - 0.5) * scale;
  }
  return out;
}
const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
const mk = (label, data) => {
  const b = device.createBuffer({ label, size: N * 4, usage });
  if (data) device.queue.writeBuffer(b, 0, data);
  return b;
};
const w0 = randomF32(N, 0.04, 1);
const W = mk('W', w0);
const G0 = mk('G0', randomF32(N, 2e-3, 2));
const G = mk('G');
await device.queue.onSubmittedWorkDone();

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };

async function timeVariant(variant, tuning = {}) {
  const opt = await Optimizer.create(ctx, layout, {
    variant, W, G, maps, label: variant, ...tuning,
    hyper: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_norm: 1.0, clip_mode: 'global' },
  });
  if (opt.mirror) opt.initMirror(w0);
  const iters = args.iters;
  const qs = hasTs ? device.createQuerySet({ type: 'timestamp', count: 4 * iters }) : null;
  const resolve = hasTs ? device.createBuffer({ size: 32 * iters,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC }) : null;
  // Steps go back to back (no waits between them), so the GPU stays busy and clocked up.
  const submitStep = (s, timed) => {
    opt.setStep(s + 1, 3e-4);
    const enc = device.createCommandEncoder();
    enc.copyBufferToBuffer(G0, 0, G, 0, N * 4);
    const ts = (k) => (qs && timed ? { timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 4 * s + k,
      endOfPassWriteIndex: 4 * s + k + 1 } } : {});
    const p1 = enc.beginComputePass(ts(0));
    opt.encodeNorm(p1);
    p1.end();
    const p2 = enc.beginComputePass(ts(2));
    opt.encodeUpdate(p2);
    p2.end();
    device.queue.submit([enc.finish()]);
  };
  // Warm up for half a second of GPU work: host-side set-up (the f16 mirror's packing takes
  // seconds for 120M weights) lets an idle GPU clock down, and it needs time to come back.
  const tw = performance.now();
  for (let k = 0; performance.now() - tw < 500 || k < 10; k++) {
    for (let j = 0; j < 10; j++) submitStep(0, false);
    await device.queue.onSubmittedWorkDone();
  }
  const t0 = performance.now();
  for (let s = 0; s < iters; s++) submitStep(s, true);
  await device.queue.onSubmittedWorkDone();
  const wall = [(performance.now() - t0) / iters];   // includes the G refresh copy
  let norm = NaN;
  let update = NaN;
  let total = median(wall);
  if (qs) {
    const enc = device.createCommandEncoder();
    enc.resolveQuerySet(qs, 0, 4 * iters, resolve, 0);
    const read = device.createBuffer({ size: resolve.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    enc.copyBufferToBuffer(resolve, 0, read, 0, resolve.size);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const t = new BigInt64Array(read.getMappedRange().slice(0));
    read.unmap();
    read.destroy();
    const ms = (a, b) => Number(t[b] - t[a]) / 1e6;
    const rows = [...Array(iters)].map((_, i) => 4 * i);
    norm = median(rows.map((r) => ms(r, r + 1)));
    update = median(rows.map((r) => ms(r + 2, r + 3)));
    total = median(rows.map((r) => ms(r, r + 1) + ms(r + 2, r + 3)));
    qs.destroy();
    resolve.destroy();
  }
  // Bytes that must move (each element once): norm reads G; fp32 update reads and writes W, G
  // (zeroed), M, V; the mirror adds 2 B/elem written; 8-bit reads and writes W, G and the codes.
  const q = opt.is8 ? opt.plan.qBlocks * opt.plan.blocksize : 0;
  const updBytes = opt.is8 ? 16 * N + 4 * q + (opt.f16 ? 2 * N : 0) + 16 * opt.plan.qBlocks
    : 32 * N + (opt.f16 ? 2 * N : 0);
  const res = { variant, tuning, norm, update, total, wallMs: median(wall), stateBytes: opt.stateBytes,
    gbps: (4 * N + updBytes) / (total * 1e6), dispatches: opt.windows.length + 1 + opt.updateDispatches,
    notes: opt.notes };
  opt.destroy();
  return res;
}

const rows = [];
for (const v of args.variants.split(',')) rows.push(await timeVariant(v, args.tuning));
const tuneRows = [];
if (args.tune) {
  for (const t of [{ bpw: 4 }, { bpw: 16 }, ...[2, 4, 8].flatMap((bpw) => [1056, 2112, 4224].map(
    (nwg8) => ({ persistent: true, bpw, nwg8 })))]) {
    tuneRows.push(await timeVariant('adamw_8bit', t));
  }
  // The same variants again, later in the run (ordering effects on clocks, allocation).
  for (const v of ['adamw_f16', 'adamw']) tuneRows.push(await timeVariant(v));
  for (const t of [{ wg: 128 }, { wg: 512 }, { wgReduce: 128 }, { wgReduce: 512 }]) {
    tuneRows.push(await timeVariant('adamw', t));
  }
}

const torch = args.torch && fs.existsSync(args.torch) ? JSON.parse(fs.readFileSync(args.torch, 'utf8')) : null;
const fp32 = rows.find((r) => r.variant === 'adamw') ?? rows[0];
const f = (x, d = 3) => (Number.isFinite(x) ? x.toFixed(d) : '-');
const lines = [];
lines.push(`optimizer phase (grad norm + clip + AdamW), ${layout.preset ?? 'custom'} layout: ` +
  `${layout.n_params.toLocaleString('en')} params, mega-buffer ${N.toLocaleString('en')} f32`);
lines.push(`GPU: ${torch?.gpu ?? adapter} | WebGPU adapter: ${adapter} | ` +
  `${hasTs ? 'timestamp-query (GPU time)' : 'wall clock'} | median of ${args.iters} steps`);
lines.push('');
lines.push('variant          norm ms  update ms  phase ms   GB/s  vs fp32  state bytes     B/param  dispatches  wall ms*');
for (const r of rows) {
  lines.push(`${r.variant.padEnd(16)} ${f(r.norm).padStart(7)} ${f(r.update).padStart(10)} ` +
    `${f(r.total).padStart(9)} ${f(r.gbps, 0).padStart(6)} ${f(r.total / fp32.total, 2).padStart(8)} ` +
    `${String(r.stateBytes).padStart(12)} ${f(r.stateBytes / layout.n_params, 2).padStart(11)} ${String(r.dispatches).padStart(11)}` +
    `${f(r.wallMs).padStart(10)}`);
}
lines.push('* wall ms: a step measured on the host, including the copy that refreshes the gradients');
if (torch) {
  lines.push('');
  lines.push(`PyTorch ${torch.torch} on the same GPU, the layout's ${torch.tensors} tensors (CUDA events, median of ${torch.iters}):`);
  for (const [k, v] of Object.entries(torch.results)) {
    lines.push(`  ${k.padEnd(42)} ${f(v.ms).padStart(7)} ms  ${f(v.gbps, 0).padStart(5)} GB/s  state ${v.state_bytes ?? '-'} B`);
  }
  const ref = torch.results['fused AdamW + clip_grad_norm_(foreach)'];
  if (ref) lines.push(`  engine fp32 phase / PyTorch fused phase: ${f(fp32.total / ref.ms, 2)}`);
}
const q8 = rows.find((r) => r.variant === 'adamw_8bit');
if (q8) {
  lines.push('');
  lines.push(`targets: fp32 phase <= PyTorch fused (${torch ? f(fp32.total / torch.results['fused AdamW + clip_grad_norm_(foreach)'].ms, 2) : '?'}x); ` +
    `8-bit phase <= 0.7x fp32 (${f(q8.total / fp32.total, 2)}x); 8-bit state <= 0.3x fp32 (${f(q8.stateBytes / fp32.stateBytes, 3)}x)`);
}
if (tuneRows.length) {
  lines.push('');
  lines.push('tuning (not defaults):');
  for (const r of tuneRows) {
    lines.push(`  ${r.variant.padEnd(12)} ${JSON.stringify(r.tuning).padEnd(40)} norm ${f(r.norm)}  update ${f(r.update)}  ` +
      `phase ${f(r.total)} ms  (wall ${f(r.wallMs)} ms/step with the grad refresh copy)`);
  }
}
const notes = [...new Set(rows.flatMap((r) => r.notes))];
if (notes.length) lines.push('', ...notes.map((n) => `note: ${n}`));
const text = lines.join('\n');
console.log(text);
if (args.out) fs.writeFileSync(args.out, text + '\n');
if (ctx.errors.length) { console.error(ctx.errors); process.exitCode = 1; }
process.exit();
