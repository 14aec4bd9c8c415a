// The browser's pseudo-gradient encoder (engine/room_codec.js) gives the server's reference bytes
// (server/room/codec.py encode) for every codec, on values that exercise rounding ties, blocks
// of zeros, a short last block, tiny and huge magnitudes; and an int8 room's version update
// added in the browser gives the server's version bit for bit (server/room/close.py Update).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  applyUpdate, CODECS, encodeDelta, encodePseudoGradient, payloadBytes, pseudoGradient,
} from '../../static/js/engine/room_codec.js';
import { serverJson } from './server.mjs';

function values(n) {
  const x = new Float32Array(n);
  let s = 12345;
  for (let i = 0; i < n; i++) {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    const u = s / 2 ** 31;
    x[i] = (u - 0.5) * 10 ** (Math.floor(u * 1e6) % 9 - 6);
  }
  x.fill(0, 256, 512);                          // a block of zeros: scale 0
  x[700] = 70000;                               // past f16's range: inf there
  // A block of scale 1 (absmax 127) with codes at ties: x.5 rounds to the even code.
  x[768] = 127;
  for (let i = 769; i < 800; i++) x[i] = (i % 2 ? 1 : -1) * ((i - 769) % 8 + 0.5);
  return x;
}

test('JS and Python encode a pseudo-gradient to the same bytes in every codec', () => {
  const x = values(256 * 5 + 77);
  const b64 = Buffer.from(x.buffer).toString('base64');
  const want = serverJson('import base64, json, sys; import numpy as np; '
    + 'from andrea.room.codec import encode; '
    + 'x = np.frombuffer(base64.b64decode(sys.argv[1]), "<f4"); '
    + 'print(json.dumps({c: base64.b64encode(encode(x, c)).decode() for c in sys.argv[2:]}))',
  b64, ...CODECS);
  for (const codec of CODECS) {
    const got = Buffer.from(encodeDelta(x, codec));
    assert.equal(got.length, payloadBytes(codec, x.length), codec);
    assert.equal(got.toString('base64'), want[codec], `${codec} bytes differ`);
  }
});

test('the pseudo-gradient is global minus the worker, rounded to f32 once', () => {
  const g = Float32Array.from([1, 1e8, -3.5, 0.1]);
  const w = Float32Array.from([0.75, 1, 1e-9, 0.3]);
  assert.deepEqual(Array.from(pseudoGradient(g, w)), Array.from(g).map((v, i) => Math.fround(v - w[i])));
  assert.throws(() => pseudoGradient(g, w.subarray(1)), /floats/);
});

test('encoded in one pass, the pseudo-gradient has the bytes of its differences encoded', () => {
  // The worker's path (encodePseudoGradient: no array of differences) against the one the
  // test above holds to the server's bytes, in every codec.
  const mine = values(256 * 5 + 77);
  const global = mine.map((v, i) => v + mine[(i * 7) % mine.length] * 0.5);
  for (const codec of CODECS) {
    const want = Buffer.from(encodeDelta(pseudoGradient(global, mine), codec));
    assert.ok(Buffer.from(encodePseudoGradient(global, mine, codec)).equals(want), codec);
  }
  assert.throws(() => encodePseudoGradient(global, mine.subarray(1), 'int8'), /floats/);
});

test('a version update added in JS gives the server\'s version bit for bit', () => {
  // Weights in (-1, 1) and steps near 1e-3, as a room's are, over enough elements (a short
  // last block too) that a product not rounded to f32 before the sum would differ somewhere
  // (about 1 element in 1000), encoded by the server as a close does.
  const n = 256 * 16 + 33;
  let seed = 7;
  const uniform = () => { seed = (seed * 1103515245 + 12345) % 2 ** 31; return seed / 2 ** 31 - 0.5; };
  const w = Float32Array.from({ length: n }, () => 2 * uniform());
  const step = Float32Array.from({ length: n }, () => 2e-3 * uniform());
  const b64 = (a) => Buffer.from(a.buffer).toString('base64');
  const want = serverJson('import base64, json, sys; import numpy as np; '
    + 'from andrea.room.codec import encode, int8_values; '
    + 'w, s = (np.frombuffer(base64.b64decode(a), "<f4") for a in sys.argv[1:]); '
    + 'body = encode(s, "int8"); '
    + 'print(json.dumps({"body": base64.b64encode(body).decode(), '
    + '"version": base64.b64encode((w + int8_values(body, w.size)).astype("<f4").tobytes()).decode()}))',
  b64(w), b64(step));
  const body = new Uint8Array(Buffer.from(want.body, 'base64')).buffer;
  const got = applyUpdate(w, body);
  assert.equal(b64(got), want.version);
  assert.equal(Buffer.from(encodeDelta(step, 'int8')).toString('base64'), want.body);
  assert.throws(() => applyUpdate(w.subarray(1), body), /bytes/);
});
