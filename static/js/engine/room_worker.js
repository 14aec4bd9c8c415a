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
// Overlapped (the room's overlap on): a worker does not wait between rounds. Its round r's
// pseudo-gradient goes up in the background and it trains round r + 1 on from its own weights
// e_r while the round closes and version r + 1 comes down. The moment the version is here (the
// Trainer's next step boundary) its weights move onto it: version + (weights - e_r), the steps
// since e_r kept; it measures the version's eval loss there, and its pseudo-gradient at the
// round's end is the version minus its weights, as always. Where the version is not here by the
// round's end, the worker waits for it there (as without overlap). The room's last round ends
// without overlap: nothing follows it. bench/room_torch.py --overlap measures what the later
// version costs the model (bench/results/).
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
//   send_ms      its pseudo-gradient: encoding it (an int8 room's on the GPU, only its body
//                read back: room_gpu.js; else the weights read back and encoded), sending
// They follow one another without gaps, so their sum is the worker's time on version v and
// everything but train_ms is the round's overhead. The room's last version, which nobody
// trains, is reported with no losses, its wait, download and eval, and train_ms = send_ms = 0.
// Overlapped, each is the time training was held up (the download and the upload themselves
// run behind the training): wait_ms for a version not here by the round's end, download_ms
// moving the weights onto it (an int8 room's on the GPU, room_gpu.js; else read back,
// set twice), send_ms the encoding (and, but for an int8 room, the read back).

import { applyUpdate, encodePseudoGradient } from './room_codec.js';
import { RoomGpu } from './room_gpu.js';
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
      sync: { every: H, at: (done) => w.atSync(done),
        early: (done) => w.arrived || (w.room.cut?.(Math.floor((done - 1) / H)) ?? false) },
      on: { record: (rec) => w.record(rec), status: (...a) => w.on.status(...a) },
    });
    // An int8 room's pseudo-gradient is made on the GPU, from the version held there.
    const { model } = w.trainer;
    if (config.room.codec === 'int8') {
      w.roomGpu = await RoomGpu.create({ device: ctx.device, kernels: model.k,
        weights: model.W, numel: layout.total_numel, overlap: w.overlap,
        mirror: w.trainer.opt.mirror ?? null });
    }
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
    this.paused = 0;              // ms since then spent not training (an overlapped move)
    this.leaving = new AbortController();   // stop(): ends a wait for the next version
    // Overlapped: the weights at the last round's end (e_r; an int8 room keeps them on the
    // GPU, roomGpu.keepEnd), the next version on its way (download's, or null where the worker
    // left), whether it is here, and the last pseudo-gradient's send and report in flight.
    this.end = null;
    this.coming = null;
    this.arrived = false;
    this.sending = Promise.resolve();
    this.moves = [];              // overlapped: [{version, step}]: where each version arrived
    this.roomGpu = null;         // int8: room_gpu.js (null: the CPU encoder)
  }

  get overlap() {
    return Boolean(this.config.room.overlap);
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
    this.roomGpu?.destroy();
    this.trainer.destroy();
  }

  record(rec) {
    this.losses.push(rec.loss);
    this.on.record(rec);
  }

  /** Loads version `version` (the room's newest instead where it was pruned meanwhile) and
   *  measures its eval loss. */
  async take(version) {
    await this.install(await this.download(version, this.timings));
    this.trainFrom = performance.now();
  }

  /** Version `version` (the room's newest instead where it was pruned meanwhile), as an update
   *  of the one held where the room sends it so; the time into t (download_ms, and wait_ms for
   *  a newest). -> {version, weights: Float32Array [total_numel]} or, an int8 room's update
   *  applied on the GPU, {version, update: ArrayBuffer} */
  async download(version, t) {
    let at = performance.now();
    let got = await this.updated(version);
    let buf;
    while (got === null && (buf = await this.room.weights(version)) === null) {
      const now = performance.now();
      t.download_ms += now - at;
      version = await this.room.nextVersion(version);   // pruned meanwhile: the newest
      at = performance.now();
      t.wait_ms += at - now;
    }
    got ??= { weights: new Float32Array(buf) };
    t.download_ms += performance.now() - at;
    return { version, ...got };
  }

  /** The eval loss of the weights in the model now (a version just set), into evalLoss. */
  async measure() {
    const at = performance.now();
    let sum = 0;
    for (let i = 0; i < EVAL_BATCHES; i++) sum += await this.trainer.evalLoss(i);
    this.evalLoss = sum / EVAL_BATCHES;
    this.timings.eval_ms += performance.now() - at;
  }

  /** Version `version` as the update of the version this worker holds (an int8 room sends the
   *  newest that way, a quarter of the weights' bytes), or null: take the weights.
   *  -> {update} (the body, applied on the GPU where the version is held there) | {weights}
   *  (applied here) | null */
  async updated(version) {
    if (this.config.room.codec !== 'int8' || !this.room.update || this.version !== version - 1
        || !(this.roomGpu || this.global)) return null;
    const body = await this.room.update(version);
    if (body === null) return null;
    return this.roomGpu ? { update: body } : { weights: applyUpdate(this.global, body) };
  }

  /** The Trainer's sync after `done` steps (their records read back): the round's end (H
   *  steps, or fewer where the room cut it), or, overlapped, the step where the next version
   *  arrived. -> the next step to train, or undefined: go on (or stop, having left). */
  async atSync(done) {
    const round = Math.ceil(done / this.config.room.inner_steps) - 1;
    const whole = done % this.config.room.inner_steps === 0 || (this.room.cut?.(round) ?? false);
    if (this.coming) {
      if (!whole && !this.arrived) return undefined;
      const at = performance.now();
      const jump = await this.rebase(round);   // at the round's end: waits for the version
      this.paused += performance.now() - at;   // not training: its timings say what it was
      if (jump !== undefined) {                // left, or a new start
        this.trainFrom = performance.now();
        this.paused = 0;
        return jump ?? undefined;
      }
      if (!whole) return undefined;
    }
    return this.endRound(done);
  }

  /** Overlapped: the next version is here (or, at the round's end, awaited): the weights move
   *  onto it with the steps trained since the last round's end, and its eval loss is measured.
   *  -> undefined (moved), null (left while waiting), or the step to go to where the version
   *  is not the one `round` trains for (the room closed a round without this worker: its
   *  steps are dropped, and it trains the newest from its start). */
  async rebase(round) {
    const t = this.timings;
    let at = performance.now();
    const got = await this.coming;
    t.wait_ms += performance.now() - at;
    this.coming = null;
    this.arrived = false;
    if (got === null) return null;
    if (got.version !== round) {
      this.losses = [];
      this.end = null;
      await this.install(got);
      return this.finish() ?? this.version * this.config.room.inner_steps;
    }
    // The steps since e_r, set aside; the version set (its eval measured); then version +
    // those steps, each an f32 `-` and `+` (as 14_room_move.wgsl does them on the GPU).
    const gpu = this.roomGpu;
    at = performance.now();
    const mine = gpu ? null : await this.trainer.model.getParams();   // e_r + the steps since
    gpu?.stepsSince();
    t.download_ms += performance.now() - at;
    await this.install(got);
    at = performance.now();
    if (gpu) {
      gpu.moveOnto();
    } else {
      const end = this.end;
      for (let i = 0; i < mine.length; i++) {
        mine[i] = got.weights[i] + Math.fround(mine[i] - end[i]);
      }
      this.trainer.setWeights(mine);
    }
    this.end = null;
    this.moves.push({ version: got.version, step: this.trainer.done });
    t.download_ms += performance.now() - at;
    return undefined;
  }

  /** Version `got` (download's) into the model and held, its eval loss measured. */
  async install(got) {
    const at = performance.now();
    if (got.update) {
      this.roomGpu.applyUpdate(got.update);
    } else {
      this.trainer.setWeights(got.weights);
      this.roomGpu?.hold();
    }
    this.version = got.version;
    // The CPU's copy of the version, where the CPU encodes and applies updates.
    this.global = this.roomGpu ? null : got.weights;
    this.timings.download_ms += performance.now() - at;
    await this.measure();
  }

  /** Overlapped: version `after` + 1 (or the newest) downloaded in the background while the
   *  next round trains; `arrived` turns true with it. -> download's | null (left).
   *  Its time is not the worker's: training went on meanwhile. */
  fetchNext(after) {
    const p = (async () => {
      const v = await this.room.nextVersion(after, this.leaving.signal);
      if (v === null) return null;
      const got = await this.download(v, noTimings());
      this.arrived = true;
      return got;
    })();
    p.catch(() => {});      // awaited at a sync; not an unhandled rejection meanwhile
    return p;
  }

  /** After `done` of the Trainer's steps (their records read back), the round's H or fewer
   *  where the room cut it: send the pseudo-gradient and report; then take the next version,
   *  or, overlapped, go on training while it comes. -> the next step to train (the Trainer's
   *  sync), undefined: the next one. */
  async endRound(done) {
    const H = this.config.room.inner_steps;
    const round = Math.ceil(done / H) - 1;
    const steps = done - round * H;     // this round's inner steps: H unless it was cut
    const t = this.timings;
    const at = performance.now();
    t.train_ms = at - (this.trainFrom ?? at) - this.paused;
    this.paused = 0;
    // The weights come back to the CPU where the CPU encodes (and keeps them for an overlapped
    // round's move); an int8 room's GPU reads back only its body, and keeps e_r itself.
    const gpu = this.roomGpu;
    const mine = gpu ? null : await this.trainer.model.getParams();
    const body = gpu ? await gpu.encode()
      : encodePseudoGradient(this.global, mine, this.config.room.codec);
    const { version, evalLoss } = this;
    const losses = this.losses;
    this.losses = [];
    this.bytesSent += body.byteLength;
    // stale (the round closed without it): the room drops it
    const send = () => this.room.send(version, body, steps);
    if (this.overlap && round + 1 < this.rounds) {
      t.send_ms = performance.now() - at;   // what held training up: the read back, the encode
      const report = rounded(t);
      // One send and report at a time, in order; a refused one fails the next round's end.
      this.sending = this.sending.then(send)
        .then(() => this.room.report(version, losses, evalLoss, report));
      this.sending.catch(() => {});
      this.on.round({ version, round, losses, evalLoss, bytes: body.byteLength });
      this.timings = noTimings();       // the next version's
      gpu?.keepEnd();
      this.end = mine;
      this.coming = this.fetchNext(version);
      this.trainFrom = performance.now();
      return undefined;                 // the next round trains on from these weights
    }
    await this.sending;                 // (an overlapped round's, before the last)
    await send();
    const sent = performance.now();
    t.send_ms = sent - at;
    this.timings = noTimings();         // the next version's: its wait starts now
    await this.room.report(version, losses, evalLoss, rounded(t));
    this.on.round({ version, round, losses, evalLoss, bytes: body.byteLength });
    const newer = await this.room.nextVersion(this.version, this.leaving.signal);
    this.timings.wait_ms += performance.now() - sent;
    if (newer === null) return undefined;   // left while waiting: the Trainer stops here
    await this.take(newer);
    return this.finish() ?? this.version * H;   // (a newer one where that was pruned meanwhile)
  }

  /** Where the version taken is the room's last: its eval loss reported too, and the step
   *  that ends the Trainer; else null. */
  finish() {
    if (this.version < this.rounds) return null;
    const last = this.room.report(this.version, [], this.evalLoss, rounded(this.timings));
    return last.then(() => this.rounds * this.config.room.inner_steps);
  }
}
