// What a checkpoint costs (engine/checkpoint.js, as Trainer.checkpoint() and a resume use it)
// under Node + Dawn: the read back of W + optimizer state in chunk_bytes parts with their SHA-256,
// the training time it takes from steps running beside it, the state load of a resume, and the
// step time, as a percentage of `every` steps.
//
//   python -m andrea.optim 120m > /tmp/l120.json
//   node bench/bench_checkpoint.mjs /tmp/l120.json [--batch 8] [--seq 1024] [--variant adamw]
//        [--chunk 67108864] [--reps 3] [--iters 10] [--every 10,50,100,500,1000]
// Env: DAWN_NODE (Dawn's dawn.node; see bench/README.md).
//
// The sections are the server's (server/optim.py checkpoint_sections) when the JSON has them
// (`checkpoint_sections: {adamw: [...], adamw_8bit: [...]}`), else the engine's own buffers.

import fs from 'node:fs';
import { dawnContext, repo } from './dawn.mjs';

const { Model } = await import(`${repo}/static/js/engine/model.js`);
const { Optimizer } = await import(`${repo}/static/js/engine/optimizer.js`);
const ck = await import(`${repo}/static/js/engine/checkpoint.js`);

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const input = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
const { layout, maps } = input;
const B = Number(opt('--batch', 8));
const T = Number(opt('--seq', layout.config.seq_len));
const variant = opt('--variant', 'adamw');
const chunkBytes = Number(opt('--chunk', 64 * 2 ** 20));
const reps = Number(opt('--reps', 3));
const iters = Number(opt('--iters', 10));
const everies = opt('--every', '10,50,100,500,1000').split(',').map(Number);

const ctx = await dawnContext();
const { device } = ctx;

const model = new Model(ctx, layout);
await model.init(0);
const optim = await Optimizer.create(ctx, layout, { variant, W: model.W, G: model.G,
  maps, hyper: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_norm: 1.0, clip_mode: 'global' } });
if (optim.mirror) optim.initMirror(await model.getParams());
model.useOptimizer({ mirror: optim.mirror, scaler: optim.scaler });
const own = [...model.stateSections(), ...optim.stateSections()];
const served = input.checkpoint_sections?.[variant.replace('_f16', '')];
const sections = ck.matchSections(served ?? own.map(({ name, bytes }) => ({ name, bytes })), own);
const plan = await model.plan(B, T);
const V = layout.config.vocab_size;
model.writeBatch(plan, Uint32Array.from({ length: B * T }, (_, i) => (i * 7919 + 13) % V),
  Uint32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % V));

let stepNo = 0;
const step = () => {
  optim.setStep(++stepNo, 1e-4);
  const enc = device.createCommandEncoder();
  model.encodeStep(enc, plan);
  optim.encode(enc);
  device.queue.submit([enc.finish()]);
};
const live = new Set();
const snapshot = () => ck.snapshotSections(device, sections, chunkBytes, live, stepNo);
// `iters` steps back to back (the trainer's steady state), optionally with a checkpoint encoded
// after the first and read back beside the rest. -> wall ms of the steps (and the checkpoint).
async function steps(withCheckpoint) {
  await device.queue.onSubmittedWorkDone();
  const t0 = performance.now();
  step();
  const snap = withCheckpoint ? snapshot() : null;
  for (let i = 1; i < iters; i++) step();
  await device.queue.onSubmittedWorkDone();
  const ms = performance.now() - t0;
  const ckpt = snap ? await snap : null;
  return { ms, ckpt, both: performance.now() - t0 };
}

for (let i = 0; i < 3; i++) step();   // warm-up (pipelines, first-use allocations)
await steps(true);
const med = (xs) => ck.median(xs);
const plain = [];
const beside = [];
const reads = [];
for (let r = 0; r < reps; r++) {
  plain.push((await steps(false)).ms);
  const w = await steps(true);
  beside.push(w.ms);
  reads.push(w.ckpt);
}
const stepMs = med(plain) / iters;
const stallMs = Math.max(0, med(beside) - med(plain));   // training time a checkpoint takes

// Alone: the read back of an idle queue (what pause and stop wait for).
const alone = [];
for (let r = 0; r < reps; r++) {
  await device.queue.onSubmittedWorkDone();
  alone.push(await snapshot());
}
const readMs = med(alone.map((c) => c.readMs));
const hashMs = med(alone.map((c) => c.hashMs));
const bytes = alone[0].bytes;

// Resume: the body back into the buffers (+ the f16 mirror from W), then a round trip check.
const body = new Uint8Array(bytes);
alone[0].parts.reduce((at, p) => { body.set(new Uint8Array(p), at); return at + p.byteLength; }, 0);
const loads = [];
for (let r = 0; r < reps; r++) {
  await device.queue.onSubmittedWorkDone();
  const t0 = performance.now();
  ck.writeSections(device, sections, body);
  if (optim.mirror) optim.initMirror(new Float32Array(body.buffer, sections[0].offset, sections[0].bytes / 4));
  await device.queue.onSubmittedWorkDone();
  loads.push(performance.now() - t0);
}
const again = await snapshot();
const roundTrip = again.chunkSha256.join() === alone[0].chunkSha256.join();
if (!roundTrip) process.exitCode = 1;

const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.description].filter(Boolean).join(' ');
const mb = bytes / 2 ** 20;
console.log(`${layout.preset ?? 'custom'}  B ${B}  T ${T}  ${variant}  on ${adapter}`);
console.log(`sections (${served ? 'server' : 'engine buffers'}): ` +
  sections.map((s) => `${s.name} ${s.bytes}`).join(', ') +
  `  = ${bytes} B (${mb.toFixed(1)} MiB) in ${alone[0].parts.length} parts of <= ${chunkBytes} B`);
console.log(`step              ${stepMs.toFixed(2)} ms (median of ${reps} x ${iters} steps back to back)`);
console.log(`checkpoint read   ${readMs.toFixed(1)} ms  (${(mb / (readMs / 1000)).toFixed(0)} MiB/s, idle queue)` +
  `  + SHA-256 ${hashMs.toFixed(1)} ms after the last part`);
console.log(`beside training   ${med(reads.map((c) => c.readMs)).toFixed(1)} ms to read back; ` +
  `the ${iters} steps took ${stallMs.toFixed(1)} ms longer (${(stallMs / stepMs).toFixed(2)} steps)`);
console.log(`resume load       ${med(loads).toFixed(1)} ms  (${(mb / (med(loads) / 1000)).toFixed(0)} MiB/s` +
  `${optim.mirror ? ', f16 mirror included' : ''}); round trip ${roundTrip ? 'bit-exact' : 'DIFFERS'}`);
const auto = ck.nextCheckpointInterval(readMs + hashMs, stepMs);
console.log(`every === null would pick every ${auto} steps (ceil(50 * (read + hash) / step))`);
console.log('every   stall % of training   read+hash % of training (upper bound)');
for (const every of [...everies, auto]) {
  const span = every * stepMs;
  console.log(`${String(every).padStart(5)}   ${(100 * stallMs / span).toFixed(3).padStart(8)} %` +
    `   ${(100 * (readMs + hashMs) / span).toFixed(3).padStart(8)} %${every === auto ? '   (auto)' : ''}`);
}
for (const b of live) b.destroy();
optim.destroy();
model.destroy();
ctx.destroy();
