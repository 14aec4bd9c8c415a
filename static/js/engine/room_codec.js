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

// x + 1.5 * 2^52 - 1.5 * 2^52 in doubles is x rounded half to even (numpy's rint) for |x| <
// 2^51: the sum has no bits below 1, and IEEE rounds it to nearest even.
const RINT = 6755399441055744;

/** delta: Float32Array [numel] -> ArrayBuffer, the body for the room's codec. */
export function encodeDelta(delta, codec) {
  return encodePseudoGradient(delta, null, codec);
}

/** The pseudo-gradient global - mine (pseudoGradient's f32 differences; mine null: global is
 *  the delta itself), encoded for the room's codec in one pass: no [numel] array of
 *  differences is made (12m: 48 MB a round). -> ArrayBuffer */
export function encodePseudoGradient(global, mine, codec) {
  if (mine && global.length !== mine.length) {
    throw new Error(`the global weights have ${global.length} floats, the worker's ${mine.length}`);
  }
  if (codec !== 'int8') {
    const delta = mine ? pseudoGradient(global, mine) : global;
    if (codec === 'f32') return delta.slice().buffer;
    if (codec !== 'f16') throw new Error(`unknown codec ${codec}; known: ${CODECS.join(', ')}`);
    const out = new Uint16Array(delta.length);
    for (let i = 0; i < delta.length; i++) out[i] = f16Bits(delta[i]);
    return out.buffer;
  }
  const n = global.length;
  const blocks = Math.ceil(n / BLOCK);
  const out = new ArrayBuffer(payloadBytes('int8', n));
  const scales = new Float32Array(out, 0, blocks);
  const codes = new Int8Array(out, 4 * blocks, n);
  const d = new Float32Array(BLOCK);     // one block's differences, rounded to f32
  for (let b = 0; b < blocks; b++) {
    const lo = b * BLOCK;
    const m = Math.min(BLOCK, n - lo);
    let absmax = 0;
    for (let j = 0; j < m; j++) {
      d[j] = mine ? global[lo + j] - mine[lo + j] : global[lo + j];
      const a = Math.abs(d[j]);
      if (a > absmax) absmax = a;
    }
    // As numpy computes it: the f32 absmax / 127 rounded to f32, x / scale in f32 (a double
    // quotient of two f32 rounded to f32 is the f32 quotient).
    const scale = Math.fround(absmax / INT8_MAX);
    scales[b] = scale;
    const safe = scale > 0 ? scale : 1;
    for (let j = 0; j < m; j++) {
      const q = (Math.fround(d[j] / safe) + RINT) - RINT;
      codes[lo + j] = q > INT8_MAX ? INT8_MAX : q < -INT8_MAX ? -INT8_MAX : q;
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
