// Ops: one recorded launch (pipeline + bind group + grid) or buffer copy. Built once per plan,
// then a step only encodes them: nothing is allocated per step. A dispatch owns its uniform
// buffer (op.owned); whoever holds the op list frees them with releaseOps.

import { bindGroup } from './shaders.js';

/** A byte sub-range of `buffer` covering f32 elements [offset, offset + numel). */
export const view = (buffer, offset = 0, numel = null) => ({
  buffer, offset: offset * 4, size: (numel ?? (buffer.size / 4 - offset)) * 4,
});

const MAX_DIM = 65535;

/** Workgroup grid for n workgroups; 2-D over 65535 (kernels linearise with flat_id). */
export function grid1d(n) {
  if (n <= MAX_DIM) return [Math.max(1, n), 1];
  const y = Math.ceil(n / MAX_DIM);
  return [Math.ceil(n / y), y];
}

/** f32 bit pattern as a u32, for mixed u32/f32 uniform structs. */
export function f32bits(x) {
  return new Uint32Array(new Float32Array([x]).buffer)[0];
}

/** Uniform buffer from u32 words (use f32bits for f32 fields), padded to 16 bytes. */
export function uniformWords(device, words, label) {
  const data = new Uint32Array(Math.ceil(words.length / 4) * 4);
  data.set(words);
  const buffer = device.createBuffer({ label, size: data.byteLength,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(buffer, 0, data);
  return buffer;
}

/** A compute launch of `p` (a ShaderLibrary pipeline record): resources binds each of its
 *  bindings by WGSL name ({name: buffer or {buffer, offset, size}}, shaders.js bindGroup). */
export function launch(device, p, resources, grid, label) {
  return { kind: 'dispatch', pipeline: p.pipeline, bindGroup: bindGroup(device, p, resources, label),
    grid, label };
}

/** Destroy the buffers `ops` own (their uniforms); the ops cannot be encoded afterwards. */
export function releaseOps(ops) {
  for (const op of ops) for (const b of op.owned ?? []) b.destroy();
}

/** Copy f32 elements between buffers (a residual stream forked before `+=` into it). */
export const copyOp = (src, dst, numel, label) => ({ kind: 'copy', src, dst, numel, label });

/** Record one dispatch op into an open compute pass. */
export function encodeDispatch(pass, op) {
  pass.setPipeline(op.pipeline);
  pass.setBindGroup(0, op.bindGroup);
  pass.dispatchWorkgroups(op.grid[0], op.grid[1] ?? 1, op.grid[2] ?? 1);
}

/** Record one copy op into `encoder` (outside any pass). */
export function encodeCopy(encoder, op) {
  encoder.copyBufferToBuffer(op.src.buffer ?? op.src, op.src.offset ?? 0,
    op.dst.buffer ?? op.dst, op.dst.offset ?? 0, op.numel * 4);
}

/** Encode ops into `encoder`, keeping consecutive dispatches in one compute pass
 *  (profiler.js times them one pass each instead). `first`: the descriptor of the first compute
 *  pass (the trainer's step-begin timestamp), or null. */
export function encodeOps(encoder, ops, first = null) {
  let pass = null;
  let desc = first;
  for (const op of ops) {
    if (op.kind === 'dispatch') {
      if (!pass) {
        pass = desc ? encoder.beginComputePass(desc) : encoder.beginComputePass();
        desc = null;
      }
      encodeDispatch(pass, op);
    } else {
      if (pass) { pass.end(); pass = null; }
      encodeCopy(encoder, op);
    }
  }
  if (pass) pass.end();
}
