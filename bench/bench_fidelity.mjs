// 8-bit AdamW against fp32: the same model, init and batches through the engine's real Trainer
// loop (prefetch, readback ring, eval every 50 steps) under Node + Dawn, on the server's default
// corpus, with the batches the server would serve (bench/prepare_fidelity.py wrote them).
//
//   python bench/prepare_fidelity.py                       # -> bench/fidelity_data (git-ignored)
//   node bench/bench_fidelity.mjs bench/fidelity_data --optimizer adamw --seed 0 --out a.json
//   node bench/bench_fidelity.mjs bench/fidelity_data --optimizer adamw_8bit --policy all \
//        --seed 0 --out b.json      [--steps N] [--batch-seed S: batches of another seed]
//   node bench/bench_fidelity.mjs bench/fidelity_data --precision mixed --seed 0 --out c.json
//   node bench/bench_fidelity.mjs --report DIR             # the table over DIR/*.json
// The run config is the form's defaults (server/run_config.py RunConfig) for the preset, with
// sample_every 0 and no checkpoints. --seed sets the init and, unless --batch-seed is given, the
// batches (as a run's seed does). --precision mixed trains with the mixed-precision matmuls and
// dynamic loss scaling where the adapter has f16 subgroup matrices (Dawn's toggle
// vulkan_enable_f16_on_nvidia is passed). --policy picks server/optim.py's 8-bit f32 policy: the layout
// file carries its f32_tensors, which the engine follows.
// Env: DAWN_NODE (Dawn's dawn.node; see bench/gpu/README.md).

import fs from 'node:fs';
import path from 'node:path';
import { dawnContext, repo } from './dawn.mjs';

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};

// ---- report

const TAIL = 50;   // final train loss: mean of the last 50 steps

function summary(recs) {
  const train = recs.filter((r) => r.loss !== null);
  const tail = train.slice(-TAIL);
  const evals = recs.filter((r) => r.eval_loss !== undefined);
  const best = evals.reduce((b, r) => (r.eval_loss < b.eval_loss ? r : b), evals[0]);
  const last = evals[evals.length - 1];
  // The trend at the end: eval loss of the last 4 evals (steps 850-1000 of 1000) against the 4 before.
  const mean = (xs) => xs.reduce((a, x) => a + x, 0) / xs.length;
  const e = evals.map((r) => r.eval_loss);
  return {
    final_train: mean(tail.map((r) => r.loss)),
    best_eval: best.eval_loss, best_eval_step: best.step, final_eval: last.eval_loss,
    eval_late: mean(e.slice(-4)), eval_before: mean(e.slice(-8, -4)),
  };
}

function report(dir) {
  const runs = fs.readdirSync(dir).filter((f) => f.endsWith('.json'))
    .map((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')));
  const name = (r) => `${r.optimizer}${r.optimizer === 'adamw_8bit' ? `/${r.policy}` : ''}` +
    `${r.precision === 'mixed' ? ' mixed' : ''} seed ${r.seed}`;
  const S = new Map(runs.map((r) => [name(r), { ...summary(r.records), run: r }]));
  const pct = (a, b) => `${(100 * (a / b - 1)).toFixed(2).padStart(6)}%`;
  console.log(`${runs[0]?.preset} B ${runs[0]?.batch_size} T ${runs[0]?.seq_len} ${runs[0]?.steps} steps, ` +
    `corpus ${runs[0]?.corpus_hash}, ${runs[0]?.adapter}`);
  console.log('run'.padEnd(28) + 'final train  best eval (step)  final eval  evals: 4 before -> last 4  s');
  for (const [k, s] of S) {
    console.log(`${k.padEnd(28)}${s.final_train.toFixed(4).padStart(11)}  ${s.best_eval.toFixed(4)} (${String(s.best_eval_step).padStart(4)})` +
      `  ${s.final_eval.toFixed(4).padStart(10)}  ${s.eval_before.toFixed(4)} -> ${s.eval_late.toFixed(4)}  ${s.run.seconds.toFixed(0).padStart(4)}`);
  }
  console.log('\ngaps against fp32 of the same seed (positive: worse than fp32); noise floor: fp32 seed 1 vs seed 0');
  console.log('pair'.padEnd(44) + 'final train   best eval  final eval');
  const rows = [];
  for (const [k, s] of S) {
    const seed = s.run.seed;
    const base = S.get(`adamw seed ${seed}`);
    if (!base || k === `adamw seed ${seed}`) continue;
    rows.push([`${k} vs adamw seed ${seed}`, s, base]);
  }
  const a0 = S.get('adamw seed 0');
  for (const [k, s] of S) {
    if (k.startsWith('adamw seed') && k !== 'adamw seed 0' && a0) rows.push([`${k} vs adamw seed 0 (noise)`, s, a0]);
  }
  for (const [label, s, b] of rows) {
    console.log(`${label.padEnd(44)}${pct(s.final_train, b.final_train)}  ${pct(s.best_eval, b.best_eval)}  ${pct(s.final_eval, b.final_eval)}`);
  }
}

if (argv[0] === '--report') {
  report(argv[1]);
  process.exit(0);
}

// ---- one run

const dir = argv[0];
const optimizer = opt('--optimizer', 'adamw');
const precision = opt('--precision', 'fp32');
const policy = opt('--policy', 'embed_f32');
const seed = Number(opt('--seed', 0));
const batchSeed = Number(opt('--batch-seed', seed));
const outFile = opt('--out', null);
const meta = JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8'));
const steps = Number(opt('--steps', meta.steps));
const { layout, maps } = JSON.parse(fs.readFileSync(path.join(dir, `layout_${policy}.json`), 'utf8'));
const B = meta.batch_size;
const T = meta.seq_len;

const u16 = (f) => { const b = fs.readFileSync(path.join(dir, f)); return new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2); };
const u32 = (f) => { const b = fs.readFileSync(path.join(dir, f)); return new Uint32Array(b.buffer, b.byteOffset, b.byteLength / 4); };
const tokens = meta.sources.map((s) => u16(s.file));
const windows = u32(`windows_seed${batchSeed}.u32`);   // [steps, B, 2]
const valWindows = u32('val_windows.u32');             // [4, B, 2]

/** The wire format (server/data/wire.py) of B rows given as (source, start) pairs. */
function body(win, index, split) {
  const offset = 40 + Math.ceil(B / 4) * 4;
  const buf = new ArrayBuffer(offset + B * (T + 1) * 4);
  const h = new Uint32Array(buf, 0, 10);
  h.set([0x42444e41, 1, B, T, index, split, 4, meta.sources.length, 0xffffffff, offset]);
  const src = new Uint8Array(buf, 40, B);
  const rows = new Uint32Array(buf, offset, B * (T + 1));
  for (let b = 0; b < B; b++) {
    const [s, start] = [win[2 * b], win[2 * b + 1]];
    src[b] = s;
    rows.set(tokens[s].subarray(start, start + T + 1), b * (T + 1));
  }
  return buf;
}
const trainBody = (step) => body(windows.subarray(step * B * 2, (step + 1) * B * 2), step, 0);
const valBody = (i) => body(valWindows.subarray(i * B * 2, (i + 1) * B * 2), i, 1);

// The rebuilt batches are the server's: step 0 against windows.sample_batch's tokens.
{
  const want = u32(`check_seed${batchSeed}.u32`);
  const got = new Uint32Array(trainBody(0), 40 + Math.ceil(B / 4) * 4);
  if (want.length !== got.length || want.some((x, i) => x !== got[i])) {
    throw new Error('batch 0 differs from the server\'s sample_batch: stale fidelity data?');
  }
}

const { Trainer } = await import(`${repo}/static/js/engine/trainer.js`);
const ctx = await dawnContext({ mixed: precision === 'mixed' });

// The server's RunConfig defaults for this preset and batch (prepare_fidelity.py wrote them).
const config = { ...meta.run_config, optimizer, seed, steps, precision };
const records = [];
const trainer = await Trainer.create({ ctx, layout, config, maps: optimizer === 'adamw_8bit' ? maps : null,
  loadBatch: async (s) => trainBody(s), loadValBatch: async (i) => valBody(i),
  on: { record: (r) => records.push({ step: r.step, loss: r.loss, eval_loss: r.eval_loss,
    ...(r.loss_scale !== undefined ? { loss_scale: r.loss_scale, skipped: r.skipped } : {}) }) } });
const t0 = performance.now();
const state = await trainer.run();
const seconds = (performance.now() - t0) / 1000;
const stateBytes = trainer.opt.stateBytes;
trainer.destroy();
records.sort((a, b) => a.step - b.step);
const s = summary(records);
const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.description].filter(Boolean).join(' ');
console.log(`${optimizer}${optimizer === 'adamw_8bit' ? `/${policy}` : ''} seed ${seed}: ${state} in ` +
  `${seconds.toFixed(1)} s (${(1000 * seconds / steps).toFixed(1)} ms/step), state ${(stateBytes / 2 ** 20).toFixed(1)} MiB; ` +
  `final train ${s.final_train.toFixed(4)}, best eval ${s.best_eval.toFixed(4)} @ ${s.best_eval_step}, final eval ${s.final_eval.toFixed(4)}` +
  (precision === 'mixed' ? `; ${records.filter((r) => r.skipped).length} steps skipped, loss scale ` +
    `${records[0]?.loss_scale} at the start, ${records[records.length - 1]?.loss_scale} at the end` : ''));
if (outFile) {
  fs.writeFileSync(outFile, JSON.stringify({ preset: meta.preset, corpus_hash: meta.corpus_hash,
    batch_size: B, seq_len: T, steps, optimizer, policy: optimizer === 'adamw_8bit' ? policy : null, precision,
    seed, batch_seed: batchSeed, adapter, seconds, state_bytes: stateBytes, state, records }));
}
