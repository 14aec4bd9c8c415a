import assert from 'node:assert/strict';
import test from 'node:test';

import { normSegments, windowSegments } from '../../static/js/engine/norm_segments.js';

// Two tensors of a group back to back (the second starts mid-vec4), a small tensor, a big one.
const layout = { params: [
  { name: 'a', offset: 0, numel: 1000 }, { name: 'b', offset: 1000, numel: 302 },
  { name: 'c', offset: 1408, numel: 64 }, { name: 'd', offset: 1536, numel: 2600 },
] };

test('segments cover every tensor exactly, never straddle a span or a tensor', () => {
  const span = 512;
  const { segs, tsegs, count } = normSegments(layout, span);
  const seen = [];
  layout.params.forEach((p, t) => {
    const [first, end] = [tsegs[4 * t], tsegs[4 * t + 1]];
    let at = p.offset;
    for (let s = first; s < end; s++) {
      const [a, b, tensor] = segs.subarray(4 * s, 4 * s + 3);
      assert.equal(a, at);                                  // contiguous, in order
      assert.equal(tensor, t);
      assert.ok(b > a && b - a <= span);
      assert.equal(Math.floor(a / span), Math.floor((b - 1) / span));   // one span
      at = b;
      seen.push(s);
    }
    assert.equal(at, p.offset + p.numel);
  });
  assert.deepEqual(seen, [...Array(count).keys()]);
  // a: [0,512) [512,1000); b: [1000,1024) [1024,1302); c: one; d: 512 | 1024..
  assert.equal(tsegs[1] - tsegs[0], 2);
  assert.equal(tsegs[5] - tsegs[4], 2);
  assert.equal(tsegs[9] - tsegs[8], 1);
});

test('a window binds the segments that start in it, and every segment is in one window', () => {
  const span = 512;
  const { segs, count } = normSegments(layout, span);
  const win = 2 * span;
  const ranges = [0, win, 2 * win, 3 * win, 4 * win].map((base) => windowSegments(segs, count, base, win));
  let next = 0;
  for (const [first, end] of ranges) {
    assert.equal(first, next);
    for (let s = first; s < end; s++) assert.ok(segs[4 * s + 1] <= Math.ceil((segs[4 * s] + 1) / win) * win);
    next = end;
  }
  assert.equal(next, count);
});

test('overlapping tensors are refused', () => {
  assert.throws(() => normSegments({ params: [{ name: 'x', offset: 0, numel: 10 },
    { name: 'y', offset: 8, numel: 4 }] }, 512), /overlaps/);
});
