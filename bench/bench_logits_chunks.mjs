// The loss over chunks of rows (model.js lossChunkRows) under Node + Dawn: per preset and batch,
// the plan's activation bytes and the training step's time (forward, loss, backward, AdamW; back
// to back) with the logits in one chunk, in the chunks this adapter's limits choose, and in
// forced chunk counts, side by side; and whether each gives the per-row losses of the first
// (one chunk where it binds) bit for bit, on the same initial weights and batch.
//
//   node bench/bench_logits_chunks.mjs [12m 120m | layout.json ...] [--batches 12m:32,128,256/120m:8,32,64]
//        [--chunks 2,4] [--iters 10] [--precision fp32|mixed]
// A spec is a preset name (its layout and 8-bit maps from `python -m andrea.optim`, $PYTHON or
// python3) or such a JSON file. Env: DAWN_NODE (Dawn's dawn.node; see bench/gpu/README.md).

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { benchArgs } from './args.mjs';

const USAGE = `usage: node bench/bench_logits_chunks.mjs [12m 120m | layout.json ...]
  [--batches 12m:32,128,256/120m:8,32,64] [--chunks 2,4] [--iters 10] [--precision fp32|mixed]`;
const argv = process.argv.slice(2);
if (argv.includes('--help') || argv.includes('-h')) {
  console.log(USAGE);
  process.exit(0);
}
const { opt, specs } = benchArgs(argv, ['--batches', '--chunks', '--iters', '--precision']);
const batchesOf = Object.fromEntries(opt('--batches', '12m:32,128,256/120m:8,32,64').split('/')
  .map((s) => s.split(':')).map(([name, list]) => [name, list.split(',').map(Number)]));
const forced = opt('--chunks', '2,4').split(',').map(Number);
const iters = Number(opt('--iters', 10));
const precision = opt('--precision', 'fp32');

const { dawnContext, backToBackMs, repo } = await import('./dawn.mjs');
const { Model, activationBytes, lossChunkRows, lossChunks } = await import(`${repo}/static/js/engine/model.js`);
const { readBuffer } = await import(`${repo}/static/js/engine/gpu.js`);
const { Optimizer } = await import(`${repo}/static/js/engine/optimizer.js`);

/** {layout, maps} of a preset name or a JSON file of python -m andrea.optim's. */
function load(spec) {
  if (fs.existsSync(spec)) return JSON.parse(fs.readFileSync(spec, 'utf8'));
  const python = process.env.PYTHON ?? 'python3';
  return JSON.parse(execFileSync(python, ['-m', 'andrea.optim', spec], { cwd: repo,
    maxBuffer: 1 << 28, env: { ...process.env, PYTHONPATH: repo } }));
}

const ctx = await dawnContext({ mixed: precision === 'mixed' });
const { device } = ctx;
const bind = Math.min(ctx.limits.maxStorageBufferBindingSize, ctx.limits.maxBufferSize);
const adapter = [ctx.info.vendor, ctx.info.architecture, ctx.info.description].filter(Boolean).join(' ');
console.log(`${precision}, AdamW, ${iters} steps back to back; on ${adapter}, binds ${(bind / 2 ** 20).toFixed(0)} MiB`);

const MiB = (b) => (b / 2 ** 20).toFixed(1);

/** {ms: mean step ms, losses: the first step's losses buffer (07_loss.wgsl)} of `layout` at
 *  (B, T) with `rows` rows per loss chunk; ms null where it could not run (`why`). */
async function stepMs({ layout, maps }, B, T, rows) {
  device.pushErrorScope('out-of-memory');
  let scoped = true;
  const model = new Model(ctx, layout, { precision, lossRows: rows });
  let optim = null;
  try {
    await model.init(0);
    optim = await Optimizer.create(ctx, layout, { variant: 'adamw', W: model.W, G: model.G,
      maps, hyper: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_norm: 1.0,
        clip_mode: 'global' } });
    if (optim.mirror) optim.initMirror(await model.getParams());
    model.useOptimizer({ mirror: optim.mirror, scaler: optim.scaler });
    const plan = await model.plan(B, T);
    scoped = false;
    const oom = await device.popErrorScope();
    if (oom) return { ms: null, why: `out of memory: ${oom.message.slice(0, 80)}` };
    const V = layout.config.vocab_size;
    model.writeBatch(plan, Uint32Array.from({ length: B * T }, (_, i) => (i * 7919 + 13) % V),
      Uint32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % V));
    const enc = device.createCommandEncoder();
    model.encodeStep(enc, plan);
    device.queue.submit([enc.finish()]);
    const losses = new Uint32Array(await readBuffer(device, plan.acts.losses));
    return { ms: await backToBackMs({ model, optim, plan }, iters), losses };
  } catch (e) {
    return { ms: null, why: e.message.slice(0, 120) };
  } finally {
    if (scoped) await device.popErrorScope();
    model.destroy();
    optim?.destroy();
    await device.queue.onSubmittedWorkDone();
  }
}

for (const spec of specs.length ? specs : ['12m', '120m']) {
  const input = load(spec);
  const { config } = input.layout;
  const name = input.layout.preset ?? spec;
  const T = config.seq_len;
  const V = config.vocab_size;
  console.log(`\n${name}  T ${T}  V ${V}`);
  console.log('   B   chunks x rows      logits MiB  activations MiB   step ms   tok/s  losses');
  for (const B of batchesOf[name] ?? [8]) {
    const N = B * T;
    const auto = lossChunkRows(N, V, ctx.limits);
    // One chunk (where it binds), this adapter's choice, then the forced counts.
    const rowsList = [...new Set([N, auto, ...forced.map((k) => Math.ceil(N / k / 64) * 64)])];
    let first = null;   // the first run's losses, to compare the others' bits with
    for (const rows of rowsList) {
      const chunks = lossChunks(N, rows).length;
      const acts = activationBytes(config, B, T, ctx.limits, precision === 'mixed', rows);
      const tag = `${chunks} x ${rows}${rows === auto ? ' (auto)' : ''}`;
      const head = `${String(B).padStart(4)}   ${tag.padEnd(18)} ${MiB(Math.min(rows, N) * V * 4).padStart(10)}` +
        `  ${MiB(acts.total).padStart(15)}`;
      if (rows * V * 4 > bind) {
        console.log(`${head}   does not bind`);
        continue;
      }
      const { ms, why, losses } = await stepMs(input, B, T, rows);
      if (ms === null) {
        console.log(`${head}   ${why}`);
        continue;
      }
      first ??= losses;
      const differ = losses.reduce((n, w, i) => n + (w !== first[i]), 0);
      const same = losses === first ? 'reference' : differ ? `${differ} words differ` : 'same bits';
      console.log(`${head}  ${ms.toFixed(2).padStart(8)}  ${Math.round((N * 1000) / ms).toString().padStart(7)}  ${same}`);
    }
  }
}
