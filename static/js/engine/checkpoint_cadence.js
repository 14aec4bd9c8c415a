// A trainer's checkpoint cadence, an object the Trainer holds (trainer.ckpt): when the state is
// read back (periodically, on pause and stop, at the end), and how each one is handed to
// on.checkpoint. The copies are encoded right after a step's submit, so a checkpoint holds
// exactly the state after that step; training never waits for one.

import { median, nextCheckpointInterval, snapshotSections } from './checkpoint.js';

const FIRST_AUTO_CHECKPOINT = 20;   // every === null: steps (after the start) to the first one
const STEP_MS_WINDOW = 16;          // every === null: step time = median of this many records

export class CheckpointCadence {
  /**
   * config: {sections, chunk_bytes, every: int | null} (the server's: the run's `checkpoint`), or
   * null (no checkpoints: every call is a no-op). The trainer's side, read when a checkpoint is
   * taken: `device`; done() the steps submitted (the state a copy encoded now holds);
   * sections() the matched state sections; recordOf(step) the promise of that step's record;
   * isBad(step) whether a non-finite loss came at or before it (such a state is never handed
   * over); deliver(ckpt) on.checkpoint; stats {checkpoints, checkpointErrors}.
   */
  constructor(config, { device, done, sections, recordOf, isBad, deliver, stats }) {
    Object.assign(this, { config, device, done, sections, recordOf, isBad, deliver, stats });
    this.inFlight = null;     // the one in flight (snapshot + deliver; never rejects)
    this.taken = null;        // the step of the last one taken
    this.saved = null;        // ... and of the last one handed over successfully
    this.next = Infinity;     // the step the next periodic one is due at
    this.stepMs = [];         // recent step times (every === null)
    this.staging = new Set(); // live MAP_READ staging buffers
    this.lastError = null;
  }

  /** The training starts (or resumes) at step `step`; a resumed one's state is the server's. */
  start(step, resumed) {
    if (resumed) this.taken = this.saved = step;
    if (!this.config) return;
    const { every } = this.config;
    this.next = every ? this.nextMultiple(step) : step + FIRST_AUTO_CHECKPOINT;
  }

  /** A step's record came back: its time counts towards the automatic interval. */
  recordStepMs(ms) {
    this.stepMs.push(ms);
    if (this.stepMs.length > STEP_MS_WINDOW) this.stepMs.shift();
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
        this.next = this.config.every ? this.nextMultiple(step)
          : step + nextCheckpointInterval(ck.readMs + ck.hashMs, median(this.stepMs));
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
