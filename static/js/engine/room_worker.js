// A room worker (server/room/: DiLoCo across the room's tabs). One Trainer whose weights come
// from the room's global versions: each round it takes version v, measures its eval loss,
// trains H inner steps on its slot's batches (the Trainer's own AdamW state carried from round
// to round, as DiLoCo's inner optimizer is), sends its pseudo-gradient (global minus its
// weights, in the room's codec) and waits for version v + 1. Round r trains version r, so the
// Trainer's step s is round floor(s / H)'s inner step s mod H, and the learning rate follows
// the run's schedule over its steps. Every version is the server's (version 0 made from the
// run's seed with the room): a worker only downloads global weights, never publishes them.
//
// A round that does not wait for the slowest (the room's wait_for_slowest off) may be cut: once
// half the workers have sent a whole round, the room says so (room.cut(v)) and a worker still
// training ends its round after the step in flight, sending the pseudo-gradient of the k steps
// it took (the close weights it by k). Its next round starts at the next version's first step.
//
// DOM-free: the app hands in the room's network as functions (room.js):
//   room = {weights(v) -> ArrayBuffer (f32 [total_numel]) | null (no longer kept: the room moved
//           on past it), update(v) -> ArrayBuffer (an int8 room's version v as an update of
//           v - 1, room_codec.js applyUpdate) | null (not kept as one: take the weights;
//           optional), send(v, ArrayBuffer, steps) -> any, report(v, losses, evalLoss,
//           timings), cut(v) -> bool (the room cut version v's round; optional),
//           nextVersion(after, signal) -> the newest version > after, or null once `signal`
//           (an AbortSignal: the worker left while it waited) is aborted}
//   loadBatch(version, step), loadValBatch(index) -> ArrayBuffer
//   on = {record(rec), round({version, losses, evalLoss, bytes}), status(status, message)}
//
// Timings. The report of version v says how this worker spent version v, in ms by its own clock
// (performance.now), in the order it happened:
//   wait_ms      waiting for v to appear: from the previous version's pseudo-gradient sent to v
//                known (that version's report, then the round's close; 0 for the version joined
//                at, and it adds a wait for the newest where v was pruned before its download)
//   download_ms  downloading v (its update where this worker holds v - 1) into the model
//   eval_ms      measuring v's eval loss (the report's eval_loss)
//   train_ms     its H inner steps on v: from the download and eval done (or run(), if later)
//                to the last step's records read back
//   send_ms      its pseudo-gradient: reading the weights back, encoding, sending
// They follow one another without gaps, so their sum is the worker's time on version v and
// everything but train_ms is the round's overhead. The room's last version, which nobody
// trains, is reported with no losses, its wait, download and eval, and train_ms = send_ms = 0.

import { applyUpdate, encodeDelta, pseudoGradient } from './room_codec.js';
import { Trainer } from './trainer.js';

const EVAL_BATCHES = 2;   // held-out batches each global version's eval loss is measured on

const noTimings = () => ({ wait_ms: 0, download_ms: 0, eval_ms: 0, train_ms: 0, send_ms: 0 });

/** Timings as reported: whole tenths of a ms, never negative. */
function rounded(t) {
  return Object.fromEntries(Object.entries(t).map(([k, ms]) =>
    [k, Math.max(0, Math.round(ms * 10) / 10)]));
}

export class RoomWorker {
  /** config: the run's (with config.room); version: the one to train first (the join's). */
  static async create({ ctx, layout, config, maps = null, version, room, loadBatch,
    loadValBatch, on = {}, stepDelayMs = 0 }) {
    const w = new RoomWorker({ config, room, on });
    const H = config.room.inner_steps;
    w.rounds = Math.ceil(config.steps / H);
    w.trainer = await Trainer.create({
      ctx, layout, maps, loadValBatch,
      // The Trainer runs every inner step of the run; samples, evals and checkpoints are the
      // room's business, not one worker's.
      config: { ...config, steps: w.rounds * H, eval_every: 0, sample_every: 0 },
      loadBatch: (step) => loadBatch(Math.floor(step / H), step % H),
      start: version * H,
      stepDelayMs,
      sync: { every: H, at: (done) => w.endRound(done),
        early: () => w.room.cut?.(w.version) ?? false },
      on: { record: (rec) => w.record(rec), status: (...a) => w.on.status(...a) },
    });
    await w.take(version);
    return w;
  }

  constructor({ config, room, on }) {
    this.config = config;
    this.room = room;
    this.on = { record: () => {}, round: () => {}, status: () => {}, ...on };
    this.losses = [];
    this.bytesSent = 0;
    this.timings = noTimings();   // the version being taken or trained (its report's timings)
    this.trainFrom = null;        // when its training started (performance.now)
    this.leaving = new AbortController();   // stop(): ends a wait for the next version
  }

  /** Trains until the room's last round or stop(); resolves to the Trainer's final state. */
  run() {
    this.trainFrom = performance.now();   // (the page's setup after create() is not training)
    return this.trainer.run();
  }

  /** Ends the worker: at once where it waits for the next version (a round that cannot close
   *  without the others would hold a leaving tab there), else after its step in flight. */
  stop(reason) {
    this.trainer.stop(reason);
    this.leaving.abort();
  }

  destroy() {
    this.trainer.destroy();
  }

  record(rec) {
    this.losses.push(rec.loss);
    this.on.record(rec);
  }

  /** Loads version `version` (the room's newest instead where it was pruned meanwhile) and
   *  measures its eval loss. */
  async take(version) {
    const t = this.timings;
    let at = performance.now();
    let w = await this.updated(version);
    let buf;
    while (w === null && (buf = await this.room.weights(version)) === null) {
      const now = performance.now();
      t.download_ms += now - at;
      version = await this.room.nextVersion(version);   // pruned meanwhile: the newest
      at = performance.now();
      t.wait_ms += at - now;
    }
    w ??= new Float32Array(buf);
    this.trainer.setWeights(w);
    this.version = version;
    this.global = w;
    let now = performance.now();
    t.download_ms += now - at;
    at = now;
    let sum = 0;
    for (let i = 0; i < EVAL_BATCHES; i++) sum += await this.trainer.evalLoss(i);
    this.evalLoss = sum / EVAL_BATCHES;
    now = performance.now();
    t.eval_ms += now - at;
    this.trainFrom = now;
  }

  /** Version `version` as the update of the version this worker holds (an int8 room sends the
   *  newest that way, a quarter of the weights' bytes), or null: take the weights. */
  async updated(version) {
    if (this.config.room.codec !== 'int8' || !this.room.update || !this.global
        || this.version !== version - 1) return null;
    const body = await this.room.update(version);
    return body === null ? null : applyUpdate(this.global, body);
  }

  /** After `done` of the Trainer's steps (their records read back), the round's H or fewer
   *  where the room cut it: send the pseudo-gradient, report, take the next version. -> the
   *  next step to train (the Trainer's sync). */
  async endRound(done) {
    const H = this.config.room.inner_steps;
    const round = Math.ceil(done / H) - 1;
    const steps = done - round * H;     // this round's inner steps: H unless it was cut
    const t = this.timings;
    const at = performance.now();
    t.train_ms = at - (this.trainFrom ?? at);
    const mine = await this.trainer.model.getParams();
    const body = encodeDelta(pseudoGradient(this.global, mine), this.config.room.codec);
    await this.room.send(this.version, body, steps);   // stale (closed without it): dropped
    const sent = performance.now();
    t.send_ms = sent - at;
    this.timings = noTimings();         // the next version's: its wait starts now
    this.bytesSent += body.byteLength;
    const losses = this.losses;
    this.losses = [];
    await this.room.report(this.version, losses, this.evalLoss, rounded(t));
    this.on.round({ version: this.version, round, losses, evalLoss: this.evalLoss,
      bytes: body.byteLength });
    const newer = await this.room.nextVersion(this.version, this.leaving.signal);
    this.timings.wait_ms += performance.now() - sent;
    if (newer === null) return undefined;   // left while waiting: the Trainer stops here
    await this.take(newer);
    const next = this.version;          // (a newer one where that one was pruned meanwhile)
    if (next < this.rounds) return next * this.config.room.inner_steps;
    // The room's last version: its eval loss reported too, and the Trainer is at its end.
    await this.room.report(next, [], this.evalLoss, rounded(this.timings));
    return this.rounds * this.config.room.inner_steps;
  }
}
