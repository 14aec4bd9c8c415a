// Lab entries for a room worker's GPU side (room_gpu.js): plain arrays in, the body out,
// so tests hold it to the server's encoder (server/room/codec.py), and an update's or an
// overlapped move's weights out, held to numpy's f32 arithmetic.

import { readBuffer, storageBuffer } from './gpu.js';
import { Kernels } from './kernels.js';
import { RoomGpu } from './room_gpu.js';

export function labEntries(ctx) {
  const { device } = ctx;

  /** `job(gpu, set)` on a RoomGpu over weights that start as `first` (Float32Array [n]; set(x)
   *  writes them), with an f16 mirror where asked; everything freed after.
   *  -> job's result, with {weights (Float32Array [n]), mirror (Uint32Array | null)} */
  async function onRoomGpu(first, { overlap = false, mirror = false }, job) {
    const n = first.length;
    const W = storageBuffer(device, 4 * n, { label: 'lab.W', data: first });
    const M = mirror ? storageBuffer(device, 4 * Math.ceil(n / 2), { label: 'lab.mirror' })
      : null;
    const kernels = new Kernels(device, ctx.lib, { maxHeadDim: ctx.modelLimits.max_head_dim,
      software: ctx.software });
    const gpu = await RoomGpu.create({ device, kernels, weights: W, numel: n, overlap,
      mirror: M });
    const set = (x) => device.queue.writeBuffer(W, 0, x.buffer, x.byteOffset, x.byteLength);
    try {
      const out = await job(gpu, set);
      return { ...out, weights: new Float32Array(await readBuffer(device, W)),
        mirror: M ? new Uint32Array(await readBuffer(device, M)) : null };
    } finally {
      gpu.destroy();
      W.destroy();
      M?.destroy();
    }
  }

  return {
    /** The int8 pseudo-gradient version - weights (Float32Array [n] each) as RoomGpu makes it
     *  on a worker: the version held (hold) while it is the weights, then the weights trained.
     *  -> {body: Uint32Array (the room's int8 body, zero-padded to whole words), bytes: its
     *  length} */
    async roomDeltaInt8({ version, weights }) {
      const { body, bytes } = await onRoomGpu(version, {}, async (gpu, set) => {
        gpu.hold();
        set(weights);
        const b = await gpu.encode();
        const words = new Uint32Array(Math.ceil(b.byteLength / 4));
        new Uint8Array(words.buffer).set(new Uint8Array(b));
        return { body: words, bytes: b.byteLength };
      });
      return { body, bytes };
    },

    /** An int8 room's next version applied on the GPU as RoomGpu does it on a worker: `held`
     *  (Float32Array [n]) set and held, then the update applied: the int8 body's first `bytes`
     *  of `body` (Uint32Array, zero-padded). mirror: also write an f16 mirror.
     *  -> {weights, version: Float32Array [n] each, mirror: Uint32Array [ceil(n / 2)] | null} */
    roomUpdate({ held, body, bytes, mirror = false }) {
      return onRoomGpu(held, { mirror }, async (gpu) => {
        gpu.hold();
        gpu.applyUpdate(body.buffer.slice(body.byteOffset, body.byteOffset + bytes));
        return { version: new Float32Array(await readBuffer(device, gpu.version)) };
      });
    },

    /** An overlapped worker's move on the GPU as RoomGpu makes it: the round's end `end`
     *  kept (keepEnd), the weights trained on to `weights` (steps since), the version
     *  `version` set and held, then moved onto (Float32Array [n] each). mirror: also write an
     *  f16 mirror. -> {weights: Float32Array [n], mirror: Uint32Array [ceil(n / 2)] | null} */
    roomMove({ version, end, weights, mirror = false }) {
      return onRoomGpu(end, { overlap: true, mirror }, async (gpu, set) => {
        gpu.keepEnd();
        set(weights);
        gpu.stepsSince();
        set(version);
        gpu.hold();
        gpu.moveOnto();
        return {};
      });
    },
  };
}
