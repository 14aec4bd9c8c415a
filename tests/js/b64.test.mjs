// Typed arrays through base64 (engine/b64.js) against Node's own codec (Buffer): the text is
// standard base64 of the array's bytes, and decoding gives the same array back. Node has no
// Uint8Array.fromBase64 yet: this runs the fallback; the pages' (Chromium's native one) runs in
// every tests/unit/gpu test, whose arrays travel this way.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decode, decodeAll, encode, encodeAll } from '../../static/js/engine/b64.js';

test('encode is standard base64 of the bytes; decode gives the array back', () => {
  const arrays = [Float32Array.from([1.5, -0, NaN, 3e38]), Int32Array.from([-1, 0, 2 ** 31 - 1]),
    Uint32Array.from({ length: 70001 }, (_, i) => (i * 2654435761) >>> 0), new Float32Array(0)];
  for (const a of arrays) {
    const got = encode(a);
    assert.equal(got.__b64__, Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('base64'));
    const back = decode(got);
    assert.equal(back.constructor, a.constructor);
    assert.deepEqual(new Uint8Array(back.buffer), new Uint8Array(a.buffer));
  }
});

test('nested objects and arrays', () => {
  const x = { a: [Float32Array.of(1, 2)], b: { c: Uint32Array.of(7) }, d: 'text', e: 3 };
  assert.deepEqual(decodeAll(encodeAll(x)), x);
});
