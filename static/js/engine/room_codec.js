// How a room worker's pseudo-gradient travels (server/room/codec.py decodes it; that file
// describes the three formats): f32, f16 (round to nearest even), or int8 block-wise absmax
// (an f32 scale absmax / 127 per block of BLOCK elements, then one int8 code per element,
// rounded half to even as numpy's rint, so this encoder gives the server's reference bytes).
// An int8 room's versions come back the same way (server/room/close.py Update): applyUpdate
// adds one to the version before it in the server's f32 arithmetic, to the same floats.

import { f16Bits } from './optimizer_tables.js';

export const CODECS = ['int8', 'f16', 'f32'];
export const BLOCK = 256;
const INT8_MAX = 127;

/** Bytes of a pseudo-gradient of `numel` elements in `codec`. */
export function payloadBytes(codec, numel) {
  if (codec === 'f32') return 4 * numel;
  if (codec === 'f16') return 2 * numel;
  if (codec === 'int8') return 4 * Math.ceil(numel / BLOCK) + numel;
  throw new Error(`unknown codec ${codec}; known: ${CODECS.join(', ')}`);
}

/** Round half to even (numpy's rint). */
function rint(x) {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** delta: Float32Array [numel] -> ArrayBuffer, the body for the room's codec. */
export function encodeDelta(delta, codec) {
  const n = delta.length;
  if (codec === 'f32') return delta.slice().buffer;
  if (codec === 'f16') {
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) out[i] = f16Bits(delta[i]);
    return out.buffer;
  }
  if (codec !== 'int8') throw new Error(`unknown codec ${codec}; known: ${CODECS.join(', ')}`);
  const blocks = Math.ceil(n / BLOCK);
  const out = new ArrayBuffer(payloadBytes('int8', n));
  const scales = new Float32Array(out, 0, blocks);
  const codes = new Int8Array(out, 4 * blocks, n);
  for (let b = 0; b < blocks; b++) {
    const lo = b * BLOCK;
    const hi = Math.min(n, lo + BLOCK);
    let absmax = 0;
    for (let i = lo; i < hi; i++) absmax = Math.max(absmax, Math.abs(delta[i]));
    // As numpy computes it: the f32 absmax / 127 rounded to f32, x / scale in f32.
    const scale = Math.fround(absmax / INT8_MAX);
    scales[b] = scale;
    const safe = scale > 0 ? scale : 1;
    for (let i = lo; i < hi; i++) {
      const q = rint(Math.fround(delta[i] / safe));
      codes[i] = Math.max(-INT8_MAX, Math.min(INT8_MAX, q));
    }
  }
  return out;
}

/** The pseudo-gradient of a round: global weights minus the worker's, in f32 (numpy's f32
 *  subtraction: the difference of two f32 rounded once). Padding stays zero: both are. */
export function pseudoGradient(global, mine) {
  if (global.length !== mine.length) {
    throw new Error(`the global weights have ${global.length} floats, the worker's ${mine.length}`);
  }
  const out = new Float32Array(global.length);
  for (let i = 0; i < out.length; i++) out[i] = global[i] - mine[i];
  return out;
}

/** An int8 room's version from the one before it: global (Float32Array [numel], version v - 1)
 *  plus the update's values q * scale, each an f32 product, then an f32 sum: numpy's f32
 *  arithmetic on the server (a sum or product of two f32 computed in double and rounded once
 *  is the f32 result), so the worker's weights are the server's bit for bit. -> a new array. */
export function applyUpdate(global, body) {
  const n = global.length;
  const blocks = Math.ceil(n / BLOCK);
  if (body.byteLength !== payloadBytes('int8', n)) {
    throw new Error(`an int8 update of this model is ${payloadBytes('int8', n)} bytes, not ${body.byteLength}`);
  }
  const scales = new Float32Array(body, 0, blocks);
  const codes = new Int8Array(body, 4 * blocks, n);
  const out = new Float32Array(n);
  for (let b = 0; b < blocks; b++) {
    const scale = scales[b];
    const hi = Math.min(n, (b + 1) * BLOCK);
    for (let i = b * BLOCK; i < hi; i++) out[i] = global[i] + Math.fround(codes[i] * scale);
  }
  return out;
}
