// An int8 room's pseudo-gradient made where the weights are (13_room_delta.wgsl): the version a
// worker holds is kept on the GPU beside its weights, and a round's end reads back only the
// codes and scales (1.016 bytes a parameter) instead of the weights (4) that room_codec.js's CPU
// encoder needs, and skips that encoder's pass over every parameter (at 120m, ~0.8 s of JS a
// round on a 2-core CPU). The body is room_codec.js's int8 format; WGSL's division may move a
// scale by its last bits and a code by one where the quotient is that near a tie
// (tests/unit/gpu/test_room_delta.py holds it to the server's numpy encoder).
//
// Overlapped (the room's overlap on), the move onto the next version happens here too
// (14_room_move.wgsl): the round's end copies the weights aside instead of reading them back,
// and the move is two passes over buffers already on the GPU instead of reading the weights
// back, a pass of JS and setting them again (room_worker.js rebase's CPU path, bit for bit:
// tests/unit/gpu/test_room_move.py).

import { checked, storageBuffer } from './gpu.js';
import { BLOCK, payloadBytes } from './room_codec.js';
import { encodeOps, releaseOps } from './ops.js';

export class GpuDelta {
  /** weights: the GPU buffer a model trains (f32 [numel], model.W); kernels: its Kernels;
   *  overlap: the room's (keeps the round's end, and moves); mirror: the run's f16 weight
   *  mirror (u32 [numel / 2], the optimizer's) or null. */
  static async create({ device, kernels, weights, numel, overlap = false, mirror = null }) {
    const d = new GpuDelta(device, numel);
    d.weights = weights;
    d.version = storageBuffer(device, 4 * numel, { label: 'room.version' });
    d.scales = storageBuffer(device, 4 * d.blocks, { label: 'room.scales' });
    d.codes = storageBuffer(device, 4 * 64 * d.blocks, { label: 'room.codes' });
    // The body's bytes in order: scales, then the codes (whole words: numel rounded up to 4).
    d.staging = device.createBuffer({ label: 'room.delta.read', size: d.stagingBytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    d.ops = [await kernels.roomDeltaInt8({ version: d.version, weights, scales: d.scales,
      codes: d.codes, numel })];
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
    this.stagingBytes = 4 * this.blocks + this.codeBytes;
    this.since = null;            // overlapped: the round's end, then the steps since it
    this.stepsSinceOp = null;
    this.moveOntoOp = null;
  }

  /** The weights now are a version (just set): kept as the one the next delta is taken from. */
  hold() {
    this.copy(this.weights, this.version);
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

  /** The pseudo-gradient held version - weights, as the room's int8 body. -> ArrayBuffer */
  async encode() {
    await checked(this.device, 'room delta', () => {
      const enc = this.device.createCommandEncoder();
      encodeOps(enc, this.ops);
      enc.copyBufferToBuffer(this.scales, 0, this.staging, 0, 4 * this.blocks);
      enc.copyBufferToBuffer(this.codes, 0, this.staging, 4 * this.blocks, this.codeBytes);
      this.device.queue.submit([enc.finish()]);
    });
    await this.staging.mapAsync(GPUMapMode.READ);
    const body = this.staging.getMappedRange().slice(0, payloadBytes('int8', this.numel));
    this.staging.unmap();
    return body;
  }

  destroy() {
    releaseOps([...this.ops, this.stepsSinceOp, this.moveOntoOp].filter(Boolean));
    for (const b of [this.version, this.scales, this.codes, this.staging, this.since]) b?.destroy();
  }
}
