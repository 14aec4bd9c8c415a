// The training loop's overhead: the engine's real Trainer (static/js/engine/trainer.js) under
// Node + Dawn, fed synthetic batches in the server's wire format (random tokens < V, a few
// sources), eval, samples and checkpoints off, beside the same step submitted back to back
// (bench_step.mjs: encode + submit only), for one layout and batch shape and each variant.
//
//   python -m andrea.optim 12m > .gpu/l12.json
//   node bench/bench_trainer.mjs .gpu/l12.json --batch 32 [--seq 256] [--steps 40] [--warmup 8]
//        [--variants adamw,adamw_8bit] [--loops] [--before FILE] [--extras STEPS]
//        [--clip-mode global|per_tensor|off] [--precision fp32|mixed]
// --loops adds loops shaped like the trainer's with one cost at a time (batch upload, the
// readback ring, the per-token losses, timestamps) to tell where a gap comes from; --before FILE
// also runs another trainer.js (e.g. an older one; it is copied beside the engine to import it).
// --extras STEPS also runs the Trainer as the page does by default over STEPS steps: eval every
// 50, a sample every 100, automatic checkpoints (read back and hashed, then dropped).
// Env: DAWN_NODE (Dawn's dawn.node; see bench/gpu/README.md).

import fs from 'node:fs';
import path from 'node:path';
import { backToBackMs, dawnContext, repo } from './dawn.mjs';

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const { layout, maps, checkpoint_sections: checkpointSections } = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
const B = Number(opt('--batch', 8));
const T = Number(opt('--seq', layout.config.seq_len));
const steps = Number(opt('--steps', 40));
const warmup = Number(opt('--warmup', 8));
const variants = opt('--variants', 'adamw,adamw_8bit').split(',');
const clipMode = opt('--clip-mode', 'global');
const precision = opt('--precision', 'fp32');
const loops = argv.includes('--loops');
const beforeFile = opt('--before', null);
const extras = Number(opt('--extras', 0));
const V = layout.config.vocab_size;
const K = 4;   // sources

const engine = `${repo}/static/js/engine`;
const { Trainer } = await import(`${engine}/trainer.js`);
const { parseBatch } = await import(`${engine}/batches.js`);
let Before = null;
let beforeCopy = null;
if (beforeFile) {
  beforeCopy = path.join(engine, `.bench_trainer_before_${process.pid}.js`);
  fs.copyFileSync(beforeFile, beforeCopy);
  try {
    ({ Trainer: Before } = await import(beforeCopy));
  } finally {
    fs.rmSync(beforeCopy);
  }
}

const ctx = await dawnContext({ mixed: precision === 'mixed' });
const { device } = ctx;

// ---- synthetic batches in the wire format (server/data/wire.py; tests/golden/batch_wire.json)

const loadTimes = [];
/** Batch `step`: the same bytes for the same step in every run. */
function body(step, split = 0) {
  const t0 = performance.now();
  let seed = (Math.imul(step + 1, 0x9e3779b1) ^ 0x5bd1e995) >>> 0 || 1;
  const rand = () => {   // xorshift32
    seed ^= seed << 13; seed >>>= 0;
    seed ^= seed >>> 17;
    seed ^= seed << 5; seed >>>= 0;
    return seed;
  };
  const offset = 40 + Math.ceil(B / 4) * 4;
  const buf = new ArrayBuffer(offset + B * (T + 1) * 4);
  new Uint32Array(buf, 0, 10).set([0x42444e41, 1, B, T, step, split, 4, K, 0xffffffff, offset]);
  const src = new Uint8Array(buf, 40, B);
  for (let b = 0; b < B; b++) src[b] = rand() % K;
  const rows = new Uint32Array(buf, offset, B * (T + 1));
  for (let i = 0; i < rows.length; i++) rows[i] = rand() % V;
  loadTimes.push(performance.now() - t0);
  return buf;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2 : NaN;
};
const f = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? '-' : x.toFixed(d));

function config(optimizer, n, { evalEvery = 0, sampleEvery = 0 } = {}) {
  return { preset: layout.preset ?? 'custom', optimizer, f16_mirror: false, steps: n,
    batch_size: B, seq_len: T, lr: 3e-4, min_lr_ratio: 0.1, warmup_steps: 10, beta1: 0.9,
    beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip_mode: clipMode, max_norm: 1.0, seed: 0,
    data_mode: 'uniform', eval_every: evalEvery, sample_every: sampleEvery, precision };
}

/** Back to back, as bench_step.mjs: encode + submit `n` steps, one wait at the end. */
async function backToBack(tr, n) {
  const { model, opt: optim, plan } = tr;
  const b = parseBatch(body(0));
  model.writeBatch(plan, b.inputs, b.targets);
  return backToBackMs({ model, optim, plan }, n);
}

/**
 * A loop shaped like the trainer's with some of its costs: upload (a new batch and the step
 * uniforms each step), ring (loss + optimizer stats copied into a ring of `ring` MAP_READ slots,
 * mapped, a slot awaited before reuse), tokens (the N per-token losses copied too and summed per
 * source on the CPU). -> ms per step over `n` steps after `w` warm-up steps.
 */
async function shapedLoop(tr, n, w, { upload = false, ring = 0, tokens = false, stamps = false }) {
  const { model, opt: optim, plan } = tr;
  const N = B * T;
  const qs = stamps ? device.createQuerySet({ type: 'timestamp', count: 3 * ring }) : null;
  const qbuf = stamps ? device.createBuffer({ size: 256 * ring,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC }) : null;
  const size = 64 + (tokens ? N * 4 : 0);
  const slots = [...Array(Math.max(ring, 1))].map(() => ({ buf: device.createBuffer({ size,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }), pending: null }));
  const batches = [...Array(4)].map((_, i) => parseBatch(body(i)));
  model.writeBatch(plan, batches[0].inputs, batches[0].targets);
  let sink = 0;
  let t0 = 0;
  for (let s = 0; s < w + n; s++) {
    if (s === w) {
      await device.queue.onSubmittedWorkDone();
      await Promise.all(slots.map((x) => x.pending));
      t0 = performance.now();
    }
    const slot = slots[s % slots.length];
    if (ring && slot.pending) await slot.pending;
    if (upload) {
      const b = batches[s % batches.length];
      model.writeBatch(plan, b.inputs, b.targets);
    }
    optim.setStep(s + 1, 1e-4);
    const enc = device.createCommandEncoder();
    const si = s % slots.length;
    model.encodeStep(enc, plan, qs ? { timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 3 * si } } : null);
    optim.encode(enc, qs ? { timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 3 * si + 1,
      endOfPassWriteIndex: 3 * si + 2 } } : {});
    if (qs) {
      enc.resolveQuerySet(qs, 3 * si, 3, qbuf, 256 * si);
      enc.copyBufferToBuffer(qbuf, 256 * si, slot.buf, 32, 24);
    }
    if (ring) {
      enc.copyBufferToBuffer(plan.acts.losses, N * 4, slot.buf, 0, 4);
      enc.copyBufferToBuffer(optim.stats, 0, slot.buf, 16, 16);
      if (tokens) enc.copyBufferToBuffer(plan.acts.losses, 0, slot.buf, 64, N * 4);
    }
    device.queue.submit([enc.finish()]);
    if (ring) {
      const b = batches[s % batches.length];
      slot.pending = slot.buf.mapAsync(GPUMapMode.READ).then(() => {
        const data = new Float32Array(slot.buf.getMappedRange());
        sink += data[0];
        if (tokens) {
          const sums = new Float64Array(K);
          for (let r = 0; r < B; r++) {
            let x = 0;
            for (let t = 0; t < T; t++) x += data[16 + r * T + t];
            sums[b.sources[r]] += x;
          }
          sink += sums[0];
        }
        slot.buf.unmap();
        slot.pending = null;
      });
    }
  }
  await device.queue.onSubmittedWorkDone();
  await Promise.all(slots.map((x) => x.pending));
  const ms = (performance.now() - t0) / n;
  for (const x of slots) x.buf.destroy();
  qs?.destroy();
  qbuf?.destroy();
  return Number.isFinite(sink) ? ms : NaN;
}

/** The real Trainer over `w + n` steps: loop ms per step after warm-up (records' arrival),
 *  the records' median step_ms, its stats and loop profile over the timed steps. */
async function trainerLoop(Cls, optimizer, n, w, pageDefaults = false) {
  const arrivals = [];
  const recs = [];
  let profAtWarm = null;
  const ckpts = [];
  const extra = pageDefaults ? {
    config: config(optimizer, w + n, { evalEvery: 50, sampleEvery: 100 }),
    loadValBatch: async (i) => body(1e6 + i, 1),
    checkpoint: { sections: checkpointSections[optimizer], chunk_bytes: 64 * 2 ** 20, every: null },
  } : { config: config(optimizer, w + n), checkpoint: null };
  const tr = await Cls.create({ ctx, layout, ...extra,
    maps: optimizer.startsWith('adamw_8bit') ? maps : null,
    loadBatch: async (s) => body(s),
    on: { checkpoint: (c) => { ckpts.push({ step: c.step, readMs: c.readMs, hashMs: c.hashMs }); },
      record: (r) => {
      arrivals.push(performance.now());
      recs.push(r);
      if (r.step === w && tr.stats.loop) profAtWarm = { ...tr.stats.loop, submitted: tr.stats.submitted };
    } } });
  const state = await tr.run();
  const stats = tr.stats;
  tr.destroy();
  const ms = (arrivals[w + n - 1] - arrivals[w - 1]) / n;
  const late = recs.slice(w);
  let prof = null;
  if (stats.loop && profAtWarm) {
    prof = {};
    for (const [k, v] of Object.entries(stats.loop)) {
      if (typeof v === 'number') prof[k] = v - profAtWarm[k];
    }
    prof.submitted = stats.submitted - profAtWarm.submitted;   // CPU parts: steps encoded since
  }
  return { state, ms, stepMs: median(late.map((r) => r.step_ms)),
    optMs: median(late.map((r) => r.opt_ms ?? NaN)), stats, prof, ckpts,
    losses: recs.map((r) => r.loss), evals: recs.filter((r) => r.eval_loss !== undefined).length };
}

const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.description].filter(Boolean).join(' ');
console.log(`${layout.preset ?? 'custom'}  B ${B}  T ${T}  ${steps} timed steps after ${warmup}  on ${adapter}` +
  `  (timestamp-query: ${device.features.has('timestamp-query')})`);
const rows = [];
for (const variant of variants) {
  const maps8 = variant.startsWith('adamw_8bit') ? maps : null;
  // Model + optimizer + plan of a trainer, for the back-to-back and shaped loops.
  const host = await Trainer.create({ ctx, layout, config: config(variant, 1), maps: maps8,
    loadBatch: async (s) => body(s), checkpoint: null });
  const r = { variant };
  r.b2b = await backToBack(host, steps);
  if (loops) {
    r.upload = await shapedLoop(host, steps, warmup, { upload: true });
    r.ring = await shapedLoop(host, steps, warmup, { upload: true, ring: 4 });
    r.ringTokens = await shapedLoop(host, steps, warmup, { upload: true, ring: 4, tokens: true });
    r.stamps = await shapedLoop(host, steps, warmup, { upload: true, ring: 4, tokens: true,
      stamps: device.features.has('timestamp-query') });
    r.ring2 = await shapedLoop(host, steps, warmup, { upload: true, ring: 2 });
  }
  host.destroy();
  if (Before) r.before = await trainerLoop(Before, variant, steps, warmup);
  r.trainer = await trainerLoop(Trainer, variant, steps, warmup);
  if (extras) r.extras = await trainerLoop(Trainer, variant, extras, warmup, true);
  if (r.before) {
    const same = r.before.losses.every((x, i) => Object.is(x, r.trainer.losses[i]));
    r.sameLosses = same;
  }
  const host2 = await Trainer.create({ ctx, layout, config: config(variant, 1), maps: maps8,
    loadBatch: async (s) => body(s), checkpoint: null });
  r.b2bAfter = await backToBack(host2, steps);
  host2.destroy();
  rows.push(r);

  const t = r.trainer;
  console.log(`\n${variant}`);
  console.log(`  back to back (encode + submit only)   ${f(r.b2b)} ms/step  (again after: ${f(r.b2bAfter)})`);
  if (loops) {
    console.log(`  shaped: + batch upload                ${f(r.upload)} ms/step`);
    console.log(`  shaped: + readback ring 4 (head)      ${f(r.ring)} ms/step`);
    console.log(`  shaped: + per-token losses, sums      ${f(r.ringTokens)} ms/step`);
    console.log(`  shaped: + timestamps (as the trainer)   ${f(r.stamps)} ms/step`);
    console.log(`  shaped: ring 2 (head)                 ${f(r.ring2)} ms/step`);
  }
  if (r.before) {
    console.log(`  Trainer (--before)                    ${f(r.before.ms)} ms/step  (records' median step_ms ` +
      `${f(r.before.stepMs)}; ring waits ${r.before.stats.ringWaits}, GPU starved ${r.before.stats.gpuStarved})`);
  }
  console.log(`  Trainer                               ${f(t.ms)} ms/step  (records' median step_ms ${f(t.stepMs)}, ` +
    `opt_ms ${f(t.optMs, 3)}; ${t.state}; ring waits ${t.stats.ringWaits}, GPU starved ${t.stats.gpuStarved})` +
    `  = ${f(t.ms / r.b2b, 3)}x back to back`);
  if (r.before) console.log(`  losses identical to --before: ${r.sameLosses}`);
  breakdown(t.prof);
  if (r.extras) {
    const x = r.extras;
    console.log(`  Trainer as the page runs it (eval every 50, sample every 100, automatic checkpoints), ` +
      `${extras} steps: ${f(x.ms)} ms/step = ${f(x.ms / r.b2b, 3)}x back to back; ${x.evals} evals, ` +
      `checkpoints at ${x.ckpts.map((c) => `${c.step} (read ${f(c.readMs, 0)} + hash ${f(c.hashMs, 0)} ms)`).join(', ') || 'none'}`);
    breakdown(x.prof);
    if (x.prof) {
      const n = x.prof.submitted;
      console.log(`    evals ${f(x.prof.evalMs, 1)} ms, checkpoint copies ${f(x.prof.checkpointMs, 1)} ms, ` +
        `samples ${f(x.prof.sampleMs, 1)} ms in all: ${f((x.prof.evalMs + x.prof.checkpointMs + x.prof.sampleMs) / n, 3)} ms/step`);
    }
  }
}

function breakdown(p) {
  if (!p) return;
  const cpu = (x) => f(x / p.submitted, 3);
  const per = (x) => f(x / p.steps, 3);
  console.log(`  loop breakdown, ms per step (CPU unless GPU; the steps after record ${warmup}):`);
  console.log(`    batch wait (prefetch) ${cpu(p.batchWaitMs)}   ring wait ${cpu(p.ringWaitMs)}   ` +
    `upload (batch + uniforms) ${cpu(p.uploadMs)}   encode ${cpu(p.encodeMs)}   submit ${cpu(p.submitMs)}`);
  console.log(`    readback (readSlot + per-source sums + on.record) ${per(p.readMs)}   ` +
    `mapAsync -> resolved ${per(p.mapMs)}   batch build (synthetic load) ${f(median(loadTimes), 3)}`);
  if (p.gpuSteps) {
    console.log(`    GPU: busy ${f(p.gpuBusyMs / p.gpuSteps, 3)} ms/step (first pass begin -> optimizer end), ` +
      `idle between steps ${f(p.gpuIdleMs / p.gpuSteps, 3)} ms/step`);
  }
}
console.log('\nsummary: variant, back-to-back ms, Trainer ms, ratio' + (Before ? ', --before Trainer ms' : '') +
  (extras ? ', as the page runs it ms (ratio)' : ''));
for (const r of rows) {
  console.log(`  ${r.variant.padEnd(12)} ${f(r.b2b).padStart(8)} ${f(r.trainer.ms).padStart(8)} ` +
    `${f(r.trainer.ms / r.b2b, 3).padStart(7)}` + (r.before ? ` ${f(r.before.ms).padStart(8)}` : '') +
    (r.extras ? ` ${f(r.extras.ms).padStart(8)} (${f(r.extras.ms / r.b2b, 3)})` : ''));
}
ctx.destroy();
