// The pure parts of checkpoints (engine/checkpoint.js): matching the server's sections to the
// engine's buffers, cutting the body into chunks, the median, digests (the cadence:
// checkpoint_cadence.test.mjs).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { chunkPlan, matchSections, median, sha256Hex, toHex }
  from '../../static/js/engine/checkpoint.js';

const own = [{ name: 'W', buffer: 'w', bytes: 40 }, { name: 'codes', buffer: 'c', bytes: 512 },
  { name: 'small', buffer: 's', bytes: 24 }];
const served = own.map(({ name, bytes }) => ({ name, bytes }));

test('sections map to the engine buffers by name, in the server order, with offsets', () => {
  assert.deepEqual(matchSections(served, own).map((s) => [s.name, s.buffer, s.bytes, s.offset]),
    [['W', 'w', 40, 0], ['codes', 'c', 512, 40], ['small', 's', 24, 552]]);
  const reordered = [served[1], served[0], served[2]];
  assert.deepEqual(matchSections(reordered, own).map((s) => [s.name, s.offset]),
    [['codes', 0], ['W', 512], ['small', 552]]);
});

test('sections that do not fit are refused with both lists', () => {
  const refuses = (list, why) => assert.throws(() => matchSections(list, own), (e) => {
    assert.match(e.message, /^checkpoint sections do not match this engine/);
    assert.ok(e.message.includes(why), e.message);
    assert.ok(e.message.includes('the engine holds [W 40 B, codes 512 B, small 24 B]'), e.message);
    return true;
  });
  refuses([served[0], { name: 'M', bytes: 40 }, served[2]], 'no state buffer named "M"');
  refuses([served[0], { name: 'codes', bytes: 508 }, served[2]], 'codes is 508 B on the server, 512 B here');
  refuses(served.slice(0, 2), 'the server does not list small');
  refuses([...served, served[0]], 'W is listed twice');
  refuses([], 'the server sent no sections');
  refuses(undefined, 'the server sent no sections');
  assert.throws(() => matchSections([{ name: 'W', bytes: 6 }], [{ name: 'W', bytes: 6 }]),
    /not a multiple of 4/);
});

test('chunks of chunk_bytes (the last shorter) filled from the sections in order', () => {
  const sections = matchSections(served, own);   // 576 bytes
  const plan = chunkPlan(sections, 256);
  assert.deepEqual(plan.map((c) => c.bytes), [256, 256, 64]);
  assert.deepEqual(plan[0].copies, [{ section: 0, src: 0, dst: 0, size: 40 },
    { section: 1, src: 0, dst: 40, size: 216 }]);
  assert.deepEqual(plan[1].copies, [{ section: 1, src: 216, dst: 0, size: 256 }]);
  assert.deepEqual(plan[2].copies, [{ section: 1, src: 472, dst: 0, size: 40 },
    { section: 2, src: 0, dst: 40, size: 24 }]);
  // Every byte of the body is copied exactly once, in order.
  for (const size of [4, 8, 36, 40, 100, 576, 1 << 20]) {
    const seen = [];
    chunkPlan(sections, size).forEach((c, i) => {
      let filled = 0;
      for (const k of c.copies) {
        assert.equal(k.dst, filled);
        filled += k.size;
        seen.push(i * size + k.dst - sections[k.section].offset - k.src);   // 0 when in place
      }
      assert.equal(filled, c.bytes);
    });
    assert.ok(seen.every((x) => x === 0));
  }
  assert.deepEqual(chunkPlan([{ name: 'codes', bytes: 0, offset: 0 }], 64), []);
  for (const bad of [0, -4, 6, 1.5, undefined]) assert.throws(() => chunkPlan(sections, bad), /chunk_bytes/);
});

test('the median of step times', () => {
  assert.equal(median([5, 1, 3]), 3);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.ok(Number.isNaN(median([])));
});

test('digests are lowercase hex SHA-256', async () => {
  assert.equal(toHex(new Uint8Array([0, 15, 16, 255]).buffer), '000f10ff');
  const data = new Uint8Array(1000).map((_, i) => (i * 31) & 255);
  assert.equal(await sha256Hex(data.buffer), createHash('sha256').update(data).digest('hex'));
});
