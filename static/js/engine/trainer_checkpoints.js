// The trainer's checkpoint cadence (mixed into Trainer.prototype by trainer.js): when the state
// is read back (periodically, on pause and stop, at the end), and how each one is handed to
// on.checkpoint. The copies are encoded right after a step's submit, so a checkpoint holds
// exactly the state after that step; training never waits for one. this.ckpt holds the
// bookkeeping (trainer.js constructor).

import { median, nextCheckpointInterval, snapshotSections } from './checkpoint.js';
import { RING } from './step_record.js';

export const checkpointMethods = {
  nextMultiple(step) {
    const { every } = this.checkpointConfig;
    return (Math.floor(step / every) + 1) * every;
  },

  /**
   * The state after the last submitted step, read back: copies into MAP_READ staging are
   * submitted now (later steps cannot change them), then mapped and copied out in
   * checkpoint.chunk_bytes parts. -> Promise<{step, parts: ArrayBuffer[], chunkSha256: string[],
   * bytes, readMs, hashMs}>. Does not call on.checkpoint (the trainer's cadence does).
   */
  checkpoint() {
    if (!this.sections) {
      throw new Error('no checkpoint sections: create the trainer with checkpoint: {sections, chunk_bytes}');
    }
    return snapshotSections(this.device, this.sections, this.checkpointConfig.chunk_bytes,
      this.ckpt.staging, this.done);
  },

  /** Takes a checkpoint now and hands it to on.checkpoint; the returned promise (also
   *  this.ckpt.inFlight until it settles) resolves once on.checkpoint's promise has, and never
   *  rejects (failures are counted in stats.checkpointErrors and kept in ckpt.lastError). */
  startCheckpoint() {
    const k = this.ckpt;
    const step = this.done;
    k.taken = step;
    // This step's record: a checkpoint of a step whose loss was non-finite is not handed over.
    const record = this.ring[(step - 1 + RING) % RING].pending;
    const snap = this.checkpoint();
    k.inFlight = (async () => {
      try {
        const ck = await snap;
        await record;
        if (this.badStep !== undefined && this.badStep <= step) return;
        this.stats.checkpoints++;
        if (this.checkpointConfig.every) {
          k.next = this.nextMultiple(step);
        } else {
          k.next = step + nextCheckpointInterval(ck.readMs + ck.hashMs, median(k.stepMs));
        }
        await this.on.checkpoint(ck);
        k.saved = Math.max(k.saved ?? 0, step);
      } catch (e) {
        this.stats.checkpointErrors++;
        k.lastError = e;
      } finally {
        k.inFlight = null;
      }
    })();
    return k.inFlight;
  },

  /** Periodic: a checkpoint when one is due and none is in flight (a due one waits for that and
   *  is taken at the first step after it, or at the end of the run). */
  maybeCheckpoint() {
    const k = this.ckpt;
    if (!this.checkpointConfig || k.inFlight || this.done < k.next || k.taken === this.done) return;
    this.startCheckpoint();
  },

  /** Once none is in flight, the periodic checkpoint if one is due (the end of a run). */
  async checkpointIfDue() {
    if (!this.checkpointConfig) return;
    while (this.ckpt.inFlight) await this.ckpt.inFlight;
    if (this.done >= this.ckpt.next && this.ckpt.taken !== this.done) await this.startCheckpoint();
  },

  /** Pause and stop: once none is in flight, a checkpoint of the current state unless the server
   *  has it already. Resolves when it has been handed over. */
  async checkpointNow() {
    if (!this.checkpointConfig) return;
    while (this.ckpt.inFlight) await this.ckpt.inFlight;
    if (this.ckpt.saved !== this.done && this.done > 0) await this.startCheckpoint();
  },
};
