// An int8 room's pseudo-gradient made where the weights are (13_room_delta.wgsl): the version a
// worker holds is kept on the GPU beside its weights, and a round's end reads back only the
// codes and scales (1.016 bytes a parameter) instead of the weights (4) that room_codec.js's CPU
// encoder needs, and skips that encoder's pass over every parameter (at 120m, ~0.8 s of JS a
// round on a 2-core CPU). The body is room_codec.js's int8 format; WGSL's division may move a
// scale by its last bits and a code by one where the quotient is that near a tie
// (tests/unit/gpu/test_room_delta.py holds it to the server's numpy encoder).

import { checked, storageBuffer } from './gpu.js';
import { BLOCK, payloadBytes } from './room_codec.js';
import { encodeOps, releaseOps } from './ops.js';

export class GpuDelta {
  /** weights: the GPU buffer a model trains (f32 [numel], model.W); kernels: its Kernels. */
  static async create({ device, kernels, weights, numel }) {
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
    return d;
  }

  constructor(device, numel) {
    this.device = device;
    this.numel = numel;
    this.blocks = Math.ceil(numel / BLOCK);
    this.codeBytes = Math.ceil(numel / 4) * 4;
    this.stagingBytes = 4 * this.blocks + this.codeBytes;
  }

  /** The weights now are a version (just set): kept as the one the next delta is taken from. */
  hold() {
    const enc = this.device.createCommandEncoder();
    enc.copyBufferToBuffer(this.weights, 0, this.version, 0, 4 * this.numel);
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
    releaseOps(this.ops);
    for (const b of [this.version, this.scales, this.codes, this.staging]) b.destroy();
  }
}
