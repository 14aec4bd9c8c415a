// The training loop: batches prefetched from the server, one command encoder and one submit per
// step (forward, loss, backward, grad norm, clip, AdamW), and a ring of MAP_READ buffers that
// brings loss, grad-norm and clip scale back asynchronously: the CPU runs ahead of the GPU by up
// to RING steps and never makes the GPU wait for a readback.
//
// DOM-free: the app hands in the device context, the server's layout and config, batch loaders,
// and callbacks for records, samples, status and checkpoints.
//
// Checkpoints (checkpoint.js; the contract's "Engine API"): with `checkpoint: {sections,
// chunk_bytes, every}` the trainer reads the state (W + optimizer state, the server's sections)
// back every `every` steps, after a pause and on stop, and hands it to on.checkpoint; the copies
// are encoded right after a step's submit, so they hold exactly the state after that step and
// training never waits for them. With `resume: {step, data}` it starts from such a body at step
// `resume.step` and continues bit-identically to the uninterrupted run.

import { Prefetcher, parseBatch } from './batches.js';
import { asBytes, matchSections, sectionBytes, writeSections } from './checkpoint.js';
import { CheckpointCadence } from './checkpoint_cadence.js';
import { lostMessage } from './gpu.js';
import { Model, limitProblems } from './model.js';
import { encodeOps } from './ops.js';
import { Optimizer } from './optimizer.js';
import { addGpuTimes, lap, newLoopProfile } from './loop_profile.js';
import { generate } from './sampler.js';
import { evalAt, lrAt, sampleAt } from './schedule.js';
import { RING, STAMPS, slotLayout, stepRecord } from './step_record.js';
import { argmaxRows, exactMatch } from './task_eval.js';
import { mlpRows, mlpStats, residualRms } from './inside_stats.js';
import { UpdateProbe } from './update_probe.js';

const QUERY_STRIDE = 256;   // resolveQuerySet's destination offsets must be multiples of 256
const SAMPLE_JOIN = '⟨…⟩';  // between a sample's prompt and what the model wrote (app/text.js)
const EVAL_LOGITS = 16;     // the eval readback: its mean loss, then (a task run) its logits

export class Trainer {
  /**
   * ctx: the engine context (context.js); layout: the run's parameter table; config: the run config
   * (server/run_config.py RunConfig); maps: 8-bit quantization maps; loadBatch(step) and
   * loadValBatch(index): async -> ArrayBuffer; decode(ids) -> string (optional);
   * on: {record(rec), sample(step, text), status(status, message), checkpoint(ckpt) -> Promise?};
   * checkpoint: null | {sections: [{name, bytes}], chunk_bytes, every: int | null} (the server's:
   * the run's `checkpoint`);
   * resume: null | {step (steps done, 0-based next step), data: ArrayBuffer (the sections
   * concatenated)}. A resume whose data or sections do not fit this engine is refused (throws)
   * before anything is written.
   * start: the first step without a resume (a room worker that joins at round r starts at r H);
   * sync: null | {every, at(stepsDone) -> Promise<next step | undefined>, early(stepsDone) ->
   * bool (optional)}: every `every` steps, and after any step `early` says true for, once their
   * records are read back, training waits for `at`, which may replace the weights (setWeights)
   * and say which step comes next (a room worker: room_worker.js; early: its round was cut).
   * stepDelayMs: each step waits this long before it is queued: a slow machine played by a
   * fast one (bench/room.py's slow tab); 0 for every real run.
   * task: null | a toy task's facts (GET /api/tasks/{task}: problem_len, answer_start,
   * answer_len, alphabet): each eval also measures the exact-match accuracy of the held-out
   * batch's problems (task_eval.js) into the record's eval_acc, and samples answer a problem.
   */
  static async create(opts) {
    const t = new Trainer(opts);
    try {
      await t.build();
    } catch (e) {
      t.destroy();   // whatever was allocated before the failure
      throw e;
    }
    return t;
  }

  constructor({ ctx, layout, config, maps = null, loadBatch, loadValBatch = null, decode = null,
    on = {}, checkpoint = null, resume = null, start = 0, sync = null, stepDelayMs = 0,
    task = null }) {
    Object.assign(this, { ctx, layout, config, maps, loadBatch, loadValBatch, decode, sync,
      stepDelayMs, task });
    this.on = { record: () => {}, sample: () => {}, status: () => {}, checkpoint: () => {}, ...on };
    this.device = ctx.device;
    this.state = 'created';
    this.step = start;             // next 0-based step to run; records are 1-based
    this.done = start;             // steps submitted: the state a checkpoint encoded now holds
    this.stats = { ringWaits: 0, gpuStarved: 0, submitted: 0, checkpoints: 0, checkpointErrors: 0,
      loop: newLoopProfile() };
    this.lastGpu = { end: undefined };   // the previous step's GPU end (timestamp ns)
    this.resumeGate = null;
    this.asks = [];                // ask()'s jobs waiting for the next step boundary
    this.asking = Promise.resolve();
    this.checkpointConfig = checkpoint;
    this.resumeFrom = resume;
    // When the state is read back and handed to on.checkpoint (checkpoint_cadence.js).
    this.ckpt = new CheckpointCadence(checkpoint, { device: ctx.device, done: () => this.done,
      sections: () => this.sections, recordOf: (step) => this.ring[(step - 1 + RING) % RING].pending,
      isBad: (step) => this.badStep !== undefined && this.badStep <= step,
      deliver: (ck) => this.on.checkpoint(ck), stats: this.stats,
      runSteps: () => this.config.steps });
    // A device lost under us (a driver reset, a crashed GPU process, a GPU switched away) stops
    // the run: what was read back is kept, nothing more can be. ctx.destroy() is not a loss.
    this.lost = null;
    ctx.device.lost?.then((info) => {
      if (ctx.closing) return;
      this.lost = lostMessage(info);
      this.stop(this.lost);
    });
  }

  get variant() {
    return this.config.optimizer + (this.config.f16_mirror ? '_f16' : '');
  }

  async build() {
    const { config: c, ctx, layout } = this;
    // Refuse before allocating anything: a plan that cannot fit must not cost gigabytes first.
    const problems = limitProblems(layout, c.batch_size, c.seq_len, ctx.limits);
    if (problems.length) throw new Error(`this GPU cannot run it: ${problems.join('; ')}`);
    const resume = this.resumeFrom;
    const cc = this.checkpointConfig;
    const served = cc?.sections;
    if (cc && (!served || !(Number.isInteger(cc.chunk_bytes) && cc.chunk_bytes > 0) ||
      !(cc.every === null || cc.every === undefined || (Number.isInteger(cc.every) && cc.every > 0)))) {
      throw new Error('checkpoint wants {sections and chunk_bytes (the server\'s), every: a positive ' +
        `integer or null}; got sections ${served ? 'given' : 'missing'}, chunk_bytes ` +
        `${cc.chunk_bytes}, every ${cc.every}`);
    }
    if (resume) {
      // Refuse a body of the wrong size before allocating (the sizes are the server's).
      if (!served) throw new Error('resume needs checkpoint.sections (the server sends them with the run)');
      const need = sectionBytes(served);
      const got = resume.data?.byteLength;
      if (got !== need) {
        throw new Error(`cannot resume: the checkpoint is ${got} bytes, the sections ` +
          `(${served.map((s) => s.name).join(', ')}) need ${need}`);
      }
      if (!Number.isInteger(resume.step) || resume.step < 0 || resume.step > c.steps) {
        throw new Error(`cannot resume at step ${resume.step}: the run has ${c.steps} steps`);
      }
    }
    const mixed = c.precision === 'mixed';
    this.model = new Model(ctx, layout, { precision: c.precision });
    // A resume overwrites W below; G starts zeroed either way (new buffers are zero in WebGPU).
    if (!resume) await this.model.init(c.seed);
    this.opt = await Optimizer.create(ctx, layout, {
      variant: this.variant, W: this.model.W, G: this.model.G, maps: this.maps,
      hyper: { beta1: c.beta1, beta2: c.beta2, eps: c.eps, weight_decay: c.weight_decay,
        max_norm: c.max_norm, clip_mode: c.clip_mode },
      lossScale: mixed ? {} : null,
    });
    if (served) {
      this.sections = matchSections(served, [...this.model.stateSections(), ...this.opt.stateSections()]);
    }
    let weights = null;   // f32 [total_numel] W as resumed, for the mirror
    if (resume) {
      const bytes = asBytes(resume.data);
      writeSections(this.device, this.sections, bytes);
      const w = this.sections.find((s) => s.name === 'W');
      const at = bytes.byteOffset + w.offset;
      weights = at % 4 ? new Float32Array(bytes.slice(w.offset, w.offset + w.bytes).buffer)
        : new Float32Array(bytes.buffer, at, w.bytes / 4);
      this.step = this.done = resume.step;
    }
    if (this.opt.mirror) {
      // Once, at start: the f16 mirror of the initial (or resumed) weights, rounded as the kernel
      // rounds (test_optimizer.py holds packHalf2 to pack2x16float); AdamW keeps it in sync after.
      this.opt.initMirror(weights ?? await this.model.getParams());
    }
    this.model.useOptimizer({ mirror: this.opt.mirror, scaler: this.opt.scaler });
    this.ckpt.start(this.done, Boolean(resume));   // a resumed state: the server holds it
    this.B = c.batch_size;
    this.T = c.seq_len;
    this.plan = await this.model.plan(this.B, this.T);
    this.slot = slotLayout(this.opt.statsBytes, this.B * this.T);
    this.ring = [...Array(RING)].map((_, i) => ({
      buf: this.device.createBuffer({ label: `readback${i}`, size: this.slot.bytes,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }),
      pending: null,
      mappedAt: 0,
    }));
    // The optimizer phase's GPU time per step, where the adapter can tell (timestamp-query;
    // browsers quantize it, Chrome to 100 us), and the step's: three timestamps per ring slot.
    if (this.device.features.has('timestamp-query')) {
      this.queries = this.device.createQuerySet({ type: 'timestamp', count: STAMPS * RING });
      this.queryBuf = this.device.createBuffer({ label: 'optimizer timestamps',
        size: QUERY_STRIDE * RING, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
    }
    // The eval's mean loss; a task run's also its logits [N, V] (from EVAL_LOGITS), whose
    // argmax is the accuracy's. Where the loss runs in chunks the logits are never whole at
    // once: no accuracy there (a task's vocabulary of 16 is always one chunk).
    this.evalLogits = Boolean(this.task) && this.plan.heads.length === 1;
    const logitBytes = this.evalLogits ? this.B * this.T * this.layout.config.vocab_size * 4 : 0;
    // Where evals run, each also records the model's inside (inside_stats.js): the update probe's
    // per-tensor sums, every RMSNorm's 1/rms per position, the MLPs' first activations.
    this.inside = this.loadValBatch && c.eval_every > 0
      ? await this.insideReadback(EVAL_LOGITS + logitBytes) : null;
    this.evalBuf = this.device.createBuffer({ label: 'eval readback',
      size: this.inside?.end ?? EVAL_LOGITS + logitBytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    this.prefetch = new Prefetcher(this.loadBatch, { depth: 3, end: c.steps });
  }

  /** The eval readback's inside part from byte `at`: {probe, probeAt, norms: each norm gain's
   *  1/rms buffer, in the parameter table's order (resid_rms's), normsAt, R (MLP positions
   *  read), mlpAt, end}. */
  async insideReadback(at) {
    const { n_layer: L, ffn_dim: F } = this.layout.config;
    const N = this.B * this.T;
    const a = this.plan.acts;
    const probe = await UpdateProbe.create(this.ctx, this.opt);
    const rstdOf = (name) => {
      const m = /layers\.(\d+)\.(input|post_attention)_layernorm/.exec(name);
      return m ? (m[2] === 'input' ? a.rstd1 : a.rstd2)[Number(m[1])] : a.rstdf;
    };
    const norms = this.layout.params.filter((p) => p.shape.length === 1).map((p) => rstdOf(p.name));
    const normsAt = at + probe.bytes;
    const R = mlpRows(N, F);
    const mlpAt = normsAt + norms.length * N * 4;
    return { probe, probeAt: at, norms, normsAt, R, mlpAt, end: mlpAt + L * R * F * 4 };
  }

  /** Copies the eval forward's inside into the eval readback; `probed` (the step before it
   *  copied its weights: probe.snapshot), the probe's sums too. */
  encodeInside(enc, probed) {
    const ins = this.inside;
    const N = this.B * this.T;
    ins.norms.forEach((b, i) => enc.copyBufferToBuffer(b, 0, this.evalBuf, ins.normsAt + i * N * 4, N * 4));
    const F = this.layout.config.ffn_dim;
    this.plan.acts.h.forEach((b, l) => enc.copyBufferToBuffer(b, 0, this.evalBuf,
      ins.mlpAt + l * ins.R * F * 4, ins.R * F * 4));
    if (probed) {
      ins.probe.encode(enc);
      ins.probe.copyTo(enc, this.evalBuf, ins.probeAt);
    }
  }

  /** The record's inside fields from the mapped eval readback. */
  readInside(range, probed) {
    const ins = this.inside;
    const { n_layer: L, ffn_dim: F, norm_eps: eps } = this.layout.config;
    const N = this.B * this.T;
    const mlp = [...Array(L).keys()].map((l) =>
      mlpStats(new Float32Array(range, ins.mlpAt + l * ins.R * F * 4, ins.R * F), ins.R, F));
    return {
      resid_rms: ins.norms.map((_, i) => residualRms(new Float32Array(range, ins.normsAt + i * N * 4, N), eps)),
      mlp_dead: mlp.map((m) => Number(m.dead.toPrecision(7))),
      mlp_hist: mlp.map((m) => m.hist),
      ...(probed ? { update_ratio: ins.probe.read(range, ins.probeAt) } : {}),
    };
  }

  /** Runs fn(model) on the weights as they are between two steps (a prompt box's question to
   *  the model that trains: generate's forward passes use their own plan, and the weights are
   *  only read), resolving to what it returns. While the loop runs, at the next step boundary
   *  once the steps in flight have landed; while paused (nothing in flight), now. */
  ask(fn) {
    if (!this.model || ['finished', 'stopped', 'failed'].includes(this.state)) {
      return Promise.reject(new Error(`the trainer has ${this.state}: its model is gone`));
    }
    return new Promise((resolve, reject) => {
      this.asks.push(() => Promise.resolve().then(() => fn(this.model)).then(resolve, reject));
      if (this.state === 'paused' || this.state === 'created') this.answerAsks();
    });
  }

  /** ask()'s jobs, one after another, once no step is in flight. */
  answerAsks() {
    this.asking = this.asking.then(async () => {
      await Promise.all(this.ring.map((s) => s.pending));
      while (this.asks.length) await this.asks.shift()();
    });
    return this.asking;
  }

  /** Stops submitting; the status turns 'paused' once the steps in flight have landed. */
  pause() {
    if (this.state !== 'running') return;
    this.state = 'pausing';
    this.resumeGate = new Promise((resolve) => { this.resumeNow = resolve; });
  }

  resume() {
    if (this.state !== 'paused' && this.state !== 'pausing') return;
    this.state = 'running';
    this.resumeNow();
    this.on.status('running');
  }

  stop(reason = 'stopped by the user') {
    if (['finished', 'stopped', 'failed'].includes(this.state)) return;
    this.stopReason = reason;
    const wasPaused = this.state === 'paused' || this.state === 'pausing';
    this.state = 'stopping';
    if (wasPaused) this.resumeNow();
  }

  /** Runs until the last step, stop() or a non-finite loss. Resolves to the final state. */
  async run() {
    const c = this.config;
    this.state = 'running';
    this.on.status('running');
    let lastDone = performance.now();
    let prevSlot = null;
    try {
      for (; this.step < c.steps && this.state !== 'stopping'; this.step++) {
        if (this.asks.length) await this.answerAsks();
        if (this.state === 'pausing') {
          await Promise.all(this.ring.map((slot) => slot.pending));
          if (this.state === 'pausing') {
            this.state = 'paused';
            this.on.status('paused');
            if (this.asks.length) this.answerAsks();   // those that came while pausing
            this.ckpt.now();   // not awaited: resume() may come before the upload is done
          }
          await this.resumeGate;
          // The steps in flight have all landed: the next step's time starts now, not at the
          // last one's record, so a pause counts in no step_ms (the page's time left is theirs).
          lastDone = performance.now();
        }
        if (this.state === 'stopping') break;
        if (this.stepDelayMs > 0) await new Promise((r) => setTimeout(r, this.stepDelayMs));
        const step = this.step;
        const prof = this.stats.loop;
        let t = performance.now();
        const batch = await this.prefetch.get(step);
        t = lap(prof, 'batchWaitMs', t);
        const slotIndex = step % RING;
        const slot = this.ring[slotIndex];
        if (slot.pending) { this.stats.ringWaits++; await slot.pending; }
        if (prevSlot && prevSlot.done) this.stats.gpuStarved++;   // the queue had run dry
        t = lap(prof, 'ringWaitMs', t);
        const lr = lrAt(step, c);
        this.model.writeBatch(this.plan, batch.inputs, batch.targets);
        this.opt.setStep(step + 1, lr);
        t = lap(prof, 'uploadMs', t);
        const enc = this.device.createCommandEncoder();
        const q0 = STAMPS * slotIndex;
        this.model.encodeStep(enc, this.plan, this.queries ? { timestampWrites: {
          querySet: this.queries, beginningOfPassWriteIndex: q0 } } : null);
        // An eval step's update is probed: the weights before it, for its eval to compare.
        if (this.inside && this.wantEval(step)) this.inside.probe.snapshot(enc);
        this.opt.encode(enc, this.queries ? { timestampWrites: { querySet: this.queries,
          beginningOfPassWriteIndex: q0 + 1, endOfPassWriteIndex: q0 + 2 } } : {});
        const N = this.B * this.T;
        const at = this.slot;
        enc.copyBufferToBuffer(this.plan.acts.losses, N * 4, slot.buf, at.loss, 12);
        enc.copyBufferToBuffer(this.opt.stats, 0, slot.buf, at.stats, this.opt.statsBytes);
        if (this.queries) {
          enc.resolveQuerySet(this.queries, q0, STAMPS, this.queryBuf, QUERY_STRIDE * slotIndex);
          enc.copyBufferToBuffer(this.queryBuf, QUERY_STRIDE * slotIndex, slot.buf, at.stamps,
            8 * STAMPS);
        }
        enc.copyBufferToBuffer(this.plan.acts.losses, 0, slot.buf, at.tokens, N * 4);
        const cmd = enc.finish();
        t = lap(prof, 'encodeMs', t);
        this.device.queue.submit([cmd]);
        t = lap(prof, 'submitMs', t);
        this.stats.submitted++;
        this.done = step + 1;
        const evalLoss = this.wantEval(step) ? (await this.encodeEval(step)).result : null;
        t = lap(prof, 'evalMs', t);
        slot.done = false;
        slot.mappedAt = performance.now();
        slot.pending = Promise.all([slot.buf.mapAsync(GPUMapMode.READ), evalLoss]).then(([, ev]) => {
          const now = performance.now();
          prof.mapMs += now - slot.mappedAt;
          const rec = this.readSlot(slot, step, lr, batch, now - lastDone, ev?.loss, ev?.acc,
            ev?.inside);
          lastDone = now;
          slot.done = true;
          slot.pending = null;
          this.ckpt.recordStepMs(rec.step_ms);
          this.on.record(rec);
          prof.steps++;
          lap(prof, 'readMs', now);
          if (rec.loss === null) {
            this.badStep = Math.min(this.badStep ?? Infinity, rec.step);
            this.stop(`the loss became non-finite at step ${rec.step}`);
          }
        });
        // A read back that fails (a lost device) surfaces where it is awaited, not as an
        // unhandled rejection before that.
        slot.pending.catch(() => {});
        prevSlot = slot;
        this.ckpt.maybe();   // after this step's submit, before the next: exactly its state
        t = lap(prof, 'checkpointMs', t);
        if (sampleAt(step + 1, c)) {
          await this.sample(step + 1, batch);
          t = lap(prof, 'sampleMs', t);
        }
        if (this.sync && ((step + 1) % this.sync.every === 0 || this.sync.early?.(step + 1))
            && this.state !== 'stopping') {
          await Promise.all(this.ring.map((s) => s.pending));
          const next = await this.sync.at(step + 1);
          if (next !== undefined) {
            this.step = next - 1;   // (the loop's ++ follows)
            this.done = next;
            this.prefetch.jump(next);
          }
          lap(prof, 'syncMs', t);
        }
      }
      await Promise.all(this.ring.map((s) => s.pending));
      const failed = this.badStep !== undefined;   // a non-finite loss stopped it
      // Stop: the state is saved (on.checkpoint's promise awaited) before the status says so.
      // A lost device has no state left to save: the last checkpoint is where it resumes.
      if (!this.lost && !failed) {
        if (this.state === 'stopping') await this.ckpt.now();
        // The end: a periodic checkpoint that came due while another was in flight is taken now.
        else await this.ckpt.ifDue();
      }
    } catch (e) {
      // A lost device fails every read back in flight: that is the loss, not a second failure.
      if (!this.lost) {
        await this.ckpt.settled();
        this.state = 'failed';
        this.on.status('failed', e.message || String(e));
        throw e;
      }
    }
    // Any end, a lost device's too: no checkpoint is left in flight (its staging buffers are
    // freed, and one whose bytes were read back before the loss is uploaded: the page's resume
    // then starts from it).
    await this.ckpt.settled();
    if (this.lost) {   // stopped, not failed: the run resumes from its last checkpoint
      this.state = 'stopped';
      this.on.status('stopped', this.lost);
      return this.state;
    }
    const failed = this.badStep !== undefined;
    this.state = this.state === 'stopping' ? (failed ? 'failed' : 'stopped') : 'finished';
    await this.answerAsks();   // the last questions get the final weights
    this.on.status(this.state, this.stopReason ?? null);
    return this.state;
  }

  readSlot(slot, step, lr, batch, ms, evalLoss, evalAcc, inside = null) {
    const range = slot.buf.getMappedRange();
    // The last step's end stays out of stats (a BigInt would not serialize to JSON).
    const optMs = this.queries ? addGpuTimes(this.stats.loop, this.lastGpu,
      new BigUint64Array(range, this.slot.stamps, STAMPS)) : null;
    const rec = stepRecord(range, { opt: this.opt, B: this.B, T: this.T, step, lr, batch, ms,
      optMs, evalLoss, evalAcc, inside });
    slot.buf.unmap();
    return rec;
  }

  wantEval(step) {
    return Boolean(this.loadValBatch) && evalAt(step + 1, this.config);
  }

  /** Eval loss of the weights now on held-out batch `index` (a room worker's measure of a
   *  global version). */
  async evalLoss(index) {
    return (await (await this.encodeEvalBatch(index)).result).loss;
  }

  /** Eval on a held-out batch, submitted right after the step (forward + loss only, G
   *  untouched). Resolves once submitted, to {result: Promise<{loss, acc}>}: acc a task run's
   *  exact-match accuracy (right / problems), else null. */
  encodeEval(step) {
    // (Its step copied its weights for the update probe: the loop's snapshot.)
    return this.encodeEvalBatch(Math.floor((step + 1) / this.config.eval_every) % 4,
      Boolean(this.inside));
  }

  /** probed: the weights before the last submitted step are in the update probe. */
  async encodeEvalBatch(index, probed = false) {
    const val = parseBatch(await this.loadValBatch(index));
    if (this.evalPending) await this.evalPending;
    // From here to submit nothing awaits, so no other step's batch can slip in between.
    this.model.writeBatch(this.plan, val.inputs, val.targets);
    const N = this.B * this.T;
    const V = this.layout.config.vocab_size;
    const enc = this.device.createCommandEncoder();
    encodeOps(enc, this.plan.forward);
    // The loss overwrites the logits with their gradient: copied before it.
    if (this.evalLogits) enc.copyBufferToBuffer(this.plan.acts.logits, 0, this.evalBuf, EVAL_LOGITS, N * V * 4);
    if (this.inside) this.encodeInside(enc, probed);
    encodeOps(enc, this.plan.loss);
    enc.copyBufferToBuffer(this.plan.acts.losses, N * 4, this.evalBuf, 0, 4);
    this.device.queue.submit([enc.finish()]);
    this.evalPending = this.evalBuf.mapAsync(GPUMapMode.READ).then(() => {
      const range = this.evalBuf.getMappedRange();
      const loss = new Float32Array(range, 0, 1)[0];
      let acc = null;
      if (this.evalLogits) {
        const predicted = argmaxRows(new Float32Array(range, EVAL_LOGITS, N * V), V);
        const { right, total } = exactMatch(predicted, val.targets, this.B, this.T, this.task);
        acc = total ? right / total : null;
      }
      const inside = this.inside ? this.readInside(range, probed) : null;
      this.evalBuf.unmap();
      this.evalPending = null;
      return { loss, acc, inside };
    });
    return { result: this.evalPending };
  }

  /** A short continuation of the batch's first row, decoded (pauses training briefly). */
  async sample(step, batch, n = 48) {
    await Promise.all(this.ring.map((s) => s.pending));
    if (this.task) return this.on.sample(step, await this.answerSample(step, batch));
    const prompt = Array.from(batch.inputs.subarray(0, 8));
    const ids = await generate(this.model, prompt, n, { seed: this.config.seed * 1000003 + step });
    const text = this.decode ? this.decode(prompt) + SAMPLE_JOIN + this.decode(ids) : ids.join(' ');
    this.on.sample(step, text);
  }

  /** A task run's sample: the batch's first problem, the model's greedy answer, and whether
   *  it is the right one (the prompt and the answer joined as a corpus sample's are). */
  async answerSample(step, batch) {
    const { answer_start: a, answer_len: n } = this.task;
    const prompt = Array.from(batch.inputs.subarray(0, a));
    const truth = Array.from(batch.inputs.subarray(a, a + n));
    const ids = await generate(this.model, prompt, n, { temperature: 0 });
    const said = (x) => (this.decode ? this.decode(x) : x.join(' '));
    const right = ids.every((id, i) => id === truth[i]);
    return `${said(prompt)}${SAMPLE_JOIN}${said(ids)}${right ? '  (right)' : `  (wrong: ${said(truth)})`}`;
  }

  /** Replaces the weights (a room's global version; f32 [total_numel]) between steps; the
   *  optimizer state stays. Call with no step in flight (sync.at is such a place). */
  setWeights(w) {
    this.model.setParams(w);
    if (this.opt.mirror) this.opt.initMirror(w);
  }

  /** The state after the last submitted step, read back (CheckpointCadence.snapshot): not
   *  handed to on.checkpoint. */
  checkpoint() {
    return this.ckpt.snapshot();
  }

  /** Frees every GPU object of the run: model (weights, grads, activations, ops), optimizer,
   *  readback ring, eval buffer, timestamp queries and checkpoint staging. Call once run() has
   *  resolved. */
  destroy() {
    this.model?.destroy();
    this.opt?.destroy();
    for (const s of this.ring ?? []) s.buf.destroy();
    this.ckpt.destroy();   // a checkpoint still being read back
    this.evalBuf?.destroy();
    this.inside?.probe.destroy();
    this.queryBuf?.destroy();
    this.queries?.destroy();
  }
}
