// An int8 room worker's side of the room, where the weights are: the version it holds is kept on
// the GPU beside its weights, so the room's traffic crosses the bus as int8 bodies (1.016 bytes a
// parameter) instead of f32 weights (4), and the CPU makes no pass over the parameters (at 120m,
// ~0.8 s of JS a round on a 2-core CPU). Three jobs, in room_codec.js's int8 format:
//   encode()        the pseudo-gradient held version - weights (13_room_delta.wgsl); WGSL's
//                   division may move a scale by its last bits and a code by one where the
//                   quotient is that near a tie (tests/unit/gpu/test_room_delta.py holds it to
//                   the server's numpy encoder)
//   applyUpdate()   the next version as the server's update of the one held (15_room_update.wgsl;
//                   room_codec.js applyUpdate on the CPU), bit for bit the server's version
//                   (tests/unit/gpu/test_room_update.py)
//   keepEnd(), stepsSince(), moveOnto()
//                   overlapped (the room's overlap on): the round's end copied aside, and the
//                   move onto the next version (14_room_move.wgsl), bit for bit room_worker.js
//                   rebase's CPU path (tests/unit/gpu/test_room_move.py)
// A mixed run's f16 weight mirror is written wherever the weights are.

import { checked, storageBuffer } from './gpu.js';
import { BLOCK, payloadBytes } from './room_codec.js';
import { encodeOps, releaseOps } from './ops.js';

export class RoomGpu {
  /** weights: the GPU buffer a model trains (f32 [numel], model.W); kernels: its Kernels;
   *  overlap: the room's (keeps the round's end, and moves); mirror: the run's f16 weight
   *  mirror (u32 [numel / 2], the optimizer's) or null. */
  static async create({ device, kernels, weights, numel, overlap = false, mirror = null }) {
    const d = new RoomGpu(device, numel);
    d.weights = weights;
    d.version = storageBuffer(device, 4 * numel, { label: 'room.version' });
    d.scales = storageBuffer(device, 4 * d.blocks, { label: 'room.scales' });
    d.codes = storageBuffer(device, 4 * 64 * d.blocks, { label: 'room.codes' });
    // An int8 body's bytes in order: scales, then the codes (whole words: numel rounded up to
    // 4): the pseudo-gradient's read back, the update's written.
    d.staging = device.createBuffer({ label: 'room.delta.read', size: d.bodyBytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    d.update = storageBuffer(device, d.bodyBytes, { label: 'room.update' });
    d.encodeOp = await kernels.roomDeltaInt8({ version: d.version, weights, scales: d.scales,
      codes: d.codes, numel });
    d.updateOp = await kernels.roomUpdate({ body: d.update, version: d.version, weights,
      mirror, numel });
    if (overlap) {
      d.since = storageBuffer(device, 4 * numel, { label: 'room.since' });
      [d.stepsSinceOp, d.moveOntoOp] = await kernels.roomMove({ weights, version: d.version,
        since: d.since, mirror, numel });
    }
    return d;
  }

  constructor(device, numel) {
    this.device = device;
    this.numel = numel;
    this.blocks = Math.ceil(numel / BLOCK);
    this.codeBytes = Math.ceil(numel / 4) * 4;
    this.bodyBytes = 4 * this.blocks + this.codeBytes;
    this.since = null;            // overlapped: the round's end, then the steps since it
    this.stepsSinceOp = null;
    this.moveOntoOp = null;
  }

  /** The weights now are a version (just set): kept as the one the next delta is taken from. */
  hold() {
    this.copy(this.weights, this.version);
  }

  /** The next version, as the room's int8 update (ArrayBuffer) of the one held: held, and
   *  set as the weights. */
  applyUpdate(body) {
    const want = payloadBytes('int8', this.numel);
    if (body.byteLength !== want) {
      throw new Error(`an int8 update of this model is ${want} bytes, not ${body.byteLength}`);
    }
    const words = new Uint8Array(this.bodyBytes);   // (writeBuffer moves whole words)
    words.set(new Uint8Array(body));
    this.device.queue.writeBuffer(this.update, 0, words);
    this.submit([this.updateOp]);
  }

  /** Overlapped: the weights now are the round's end (e_r), kept aside for the move. */
  keepEnd() {
    this.copy(this.weights, this.since);
  }

  /** Overlapped, before the next version is set: the steps trained since the round's end
   *  (weights - e_r), kept aside. */
  stepsSince() {
    this.submit([this.stepsSinceOp]);
  }

  /** Overlapped, the next version set and held: the weights move onto it, version + the steps
   *  since (and the f16 mirror with them). */
  moveOnto() {
    this.submit([this.moveOntoOp]);
  }

  /** The pseudo-gradient held version - weights, as the room's int8 body. -> ArrayBuffer */
  async encode() {
    await checked(this.device, 'room delta', () => {
      const enc = this.device.createCommandEncoder();
      encodeOps(enc, [this.encodeOp]);
      enc.copyBufferToBuffer(this.scales, 0, this.staging, 0, 4 * this.blocks);
      enc.copyBufferToBuffer(this.codes, 0, this.staging, 4 * this.blocks, this.codeBytes);
      this.device.queue.submit([enc.finish()]);
    });
    await this.staging.mapAsync(GPUMapMode.READ);
    const body = this.staging.getMappedRange().slice(0, payloadBytes('int8', this.numel));
    this.staging.unmap();
    return body;
  }

  copy(from, to) {
    const enc = this.device.createCommandEncoder();
    enc.copyBufferToBuffer(from, 0, to, 0, 4 * this.numel);
    this.device.queue.submit([enc.finish()]);
  }

  submit(ops) {
    const enc = this.device.createCommandEncoder();
    encodeOps(enc, ops);
    this.device.queue.submit([enc.finish()]);
  }

  destroy() {
    releaseOps([this.encodeOp, this.updateOp, this.stepsSinceOp, this.moveOntoOp].filter(Boolean));
    for (const b of [this.version, this.scales, this.codes, this.staging, this.update, this.since]) {
      b?.destroy();
    }
  }
}
