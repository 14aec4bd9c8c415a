// A trainer's checkpoint cadence, an object the Trainer holds (trainer.ckpt): when the state is
// read back (periodically, on pause and stop, at the end), and how each one is handed to
// on.checkpoint. The copies are encoded right after a step's submit, so a checkpoint holds
// exactly the state after that step; training never waits for one.

import { median, snapshotSections } from './checkpoint.js';

// every === null: the trainer picks the cadence. A crash loses at most a tenth of the run's steps
// or RISK_MS of training, whichever is less (plus the read back and upload of the checkpoint in
// flight), and, where those bounds leave room, checkpoints cost ~2% of training time:
//   - by steps: one at every multiple of a tenth of the run (RUN_SHARE: 20, 40, ..., 200 of a
//     200-step run), whatever the step speed; at most ~10 periodic checkpoints per run, so a short
//     run's total cost is bounded by their count (and one in flight at a time), not a share;
//   - by time: at most RISK_MS (2 min) of steps, at the trainer's step time, after the last one;
//     a checkpoint dearer than MAX_SHARE of that (read back + digests over 12 s) stretches it to
//     ckptMs / MAX_SHARE, so the time bound never takes more than 10% of training time;
//   - no sooner than the cost rule, within those bounds: a minute apart (MIN_INTERVAL_MS: not one
//     upload per step for a small model) and COST_FACTOR x ckptMs (~2% of training time).
// Before the first one (no read-back time yet): FIRST_AUTO_CHECKPOINT steps after the start, or
// sooner by either bound (a minute of steps once a step time is known). Training never waits for
// a checkpoint: a due one waits for the one in flight and is taken at the first step after it.
// (The cost rule used to come first: a 200-step run on a GPU kept one checkpoint, at step 20.)
export const RUN_SHARE = 10;           // periodic checkpoints per run, by steps
export const RISK_MS = 120_000;        // training at risk, at most (but see MAX_SHARE)
export const MAX_SHARE = 0.1;          // of training time the time bound may spend on checkpoints
export const MIN_INTERVAL_MS = 60_000; // cheap checkpoints: once a minute
export const COST_FACTOR = 50;         // ~2% of training time: 50 x (read back + digests)
export const FIRST_AUTO_CHECKPOINT = 20;
const STEP_MS_WINDOW = 16;             // step time = median of this many records

/**
 * every === null: the step the next checkpoint is due at, after one at `step` (or the start).
 * runSteps: the run's steps (config.steps; not a positive number: no bound by steps); stepMs: a
 * training step; ckptMs: the last checkpoint's read back + digests (both in ms; NaN: not known).
 */
export function nextAutoCheckpoint(step, { runSteps, stepMs, ckptMs = NaN }) {
  const share = runSteps > 0 ? Math.ceil(runSteps / RUN_SHARE) : Infinity;
  const byRun = (Math.floor(step / share) + 1) * share;   // Infinity without runSteps
  if (!(stepMs > 0)) return Math.min(byRun, step + FIRST_AUTO_CHECKPOINT);
  const cost = Number.isFinite(ckptMs) && ckptMs > 0 ? ckptMs : 0;
  const ms = Math.min(Math.max(MIN_INTERVAL_MS, COST_FACTOR * cost),   // the cost rule
    Math.max(RISK_MS, cost / MAX_SHARE));                             // the time bound
  const byTime = step + Math.max(1, Math.ceil(ms / stepMs));
  return Number.isFinite(ckptMs) ? Math.min(byRun, byTime)
    : Math.min(byRun, byTime, step + FIRST_AUTO_CHECKPOINT);
}

export class CheckpointCadence {
  /**
   * config: {sections, chunk_bytes, every: int | null} (the server's: the run's `checkpoint`), or
   * null (no checkpoints: every call is a no-op). The trainer's side, read when a checkpoint is
   * taken: `device`; done() the steps submitted (the state a copy encoded now holds);
   * sections() the matched state sections; recordOf(step) the promise of that step's record;
   * isBad(step) whether a non-finite loss came at or before it (such a state is never handed
   * over); deliver(ckpt) on.checkpoint; stats {checkpoints, checkpointErrors}; runSteps() the
   * run's steps (every === null: the bound by steps; nextAutoCheckpoint).
   */
  constructor(config, { device, done, sections, recordOf, isBad, deliver, stats,
    runSteps = () => NaN }) {
    Object.assign(this, { config, device, done, sections, recordOf, isBad, deliver, stats,
      runSteps });
    this.inFlight = null;     // the one in flight (snapshot + deliver; never rejects)
    this.taken = null;        // the step of the last one taken
    this.saved = null;        // ... and of the last one handed over successfully
    this.next = Infinity;     // the step the next periodic one is due at
    this.stepMs = [];         // recent step times (every === null)
    this.first = null;        // every === null: the start, until the first one is read back
    this.staging = new Set(); // live MAP_READ staging buffers
    this.lastError = null;
  }

  /** The training starts (or resumes) at step `step`; a resumed one's state is the server's. */
  start(step, resumed) {
    if (resumed) this.taken = this.saved = step;
    if (!this.config) return;
    const { every } = this.config;
    if (every) this.next = this.nextMultiple(step);
    else {
      this.first = step;
      this.next = nextAutoCheckpoint(step, { runSteps: this.runSteps(), stepMs: NaN });
    }
  }

  /** A step's record came back: its time counts towards the automatic interval (and, before the
   *  first checkpoint, may bring that one forward: a minute of slow steps comes before 20). */
  recordStepMs(ms) {
    this.stepMs.push(ms);
    if (this.stepMs.length > STEP_MS_WINDOW) this.stepMs.shift();
    if (this.first !== null) {
      this.next = Math.min(this.next, nextAutoCheckpoint(this.first,
        { runSteps: this.runSteps(), stepMs: median(this.stepMs) }));
    }
  }

  nextMultiple(step) {
    const { every } = this.config;
    return (Math.floor(step / every) + 1) * every;
  }

  /**
   * The state after the last submitted step, read back: copies into MAP_READ staging are
   * submitted now (later steps cannot change them), then mapped and copied out in
   * checkpoint.chunk_bytes parts. -> Promise<{step, parts: ArrayBuffer[], chunkSha256: string[],
   * bytes, readMs, hashMs}>. Does not hand it over (the cadence does).
   */
  snapshot() {
    const sections = this.sections();
    if (!sections) {
      throw new Error('no checkpoint sections: create the trainer with checkpoint: {sections, chunk_bytes}');
    }
    return snapshotSections(this.device, sections, this.config.chunk_bytes, this.staging, this.done());
  }

  /** Takes a checkpoint now and hands it over; the returned promise (also this.inFlight until it
   *  settles) resolves once deliver's promise has, and never rejects (failures are counted in
   *  stats.checkpointErrors and kept in lastError). */
  take() {
    const step = this.done();
    this.taken = step;
    // This step's record: a checkpoint of a step whose loss was non-finite is not handed over.
    const record = this.recordOf(step);
    const snap = this.snapshot();
    const taking = (async () => {
      try {
        const ck = await snap;
        await record;
        if (this.isBad(step)) return;
        this.stats.checkpoints++;
        this.first = null;
        this.next = this.config.every ? this.nextMultiple(step)
          : nextAutoCheckpoint(step, { runSteps: this.runSteps(), stepMs: median(this.stepMs),
            ckptMs: ck.readMs + ck.hashMs });
        await this.deliver(ck);
        this.saved = Math.max(this.saved ?? 0, step);
      } catch (e) {
        this.stats.checkpointErrors++;
        this.lastError = e;
      } finally {
        if (this.inFlight === taking) this.inFlight = null;
      }
    })();
    this.inFlight = taking;
    return taking;
  }

  /** Periodic: a checkpoint when one is due and none is in flight (a due one waits for that and
   *  is taken at the first step after it, or at the end of the run). */
  maybe() {
    const done = this.done();
    if (!this.config || this.inFlight || done < this.next || this.taken === done) return;
    this.take();
  }

  /** Once none is in flight, the periodic checkpoint if one is due (the end of a run). */
  async ifDue() {
    if (!this.config) return;
    // Looked at again here, in the go that takes one: a pause's and a stop's callers woken by
    // the same settling both saw none in flight, and both read back and uploaded one state.
    do await this.settled(); while (this.inFlight);
    const done = this.done();
    if (done >= this.next && this.taken !== done) await this.take();
  }

  /** Pause and stop: once none is in flight, a checkpoint of the current state unless the server
   *  has it already. Resolves when it has been handed over. */
  async now() {
    if (!this.config) return;
    // Looked at again here, in the go that takes one: a pause's and a stop's callers woken by
    // the same settling both saw none in flight, and both read back and uploaded one state.
    do await this.settled(); while (this.inFlight);
    const done = this.done();
    if (this.saved !== done && done > 0) await this.take();
  }

  /** Once no checkpoint is in flight (its staging buffers freed). */
  async settled() {
    while (this.inFlight) await this.inFlight;
  }

  /** Frees the staging buffers of a checkpoint still being read back. */
  destroy() {
    for (const b of this.staging) b.destroy();
    this.staging.clear();
  }
}
