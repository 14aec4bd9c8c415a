// The pure parts of checkpoints (engine/checkpoint.js): matching the server's sections to the
// engine's buffers, cutting the body into chunks, the ~2% cadence, digests.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { RISK_MS, RISK_STEPS, chunkPlan, matchSections, median, nextCheckpointInterval, sha256Hex,
  toHex }
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

test('every === null: a minute apart, 2% of training time, a bounded loss on a crash', () => {
  assert.equal(nextCheckpointInterval(1000, 300), 200);  // a minute of 300 ms steps
  assert.equal(nextCheckpointInterval(600, 100), 600);   // 2% of training time (a minute)
  assert.equal(nextCheckpointInterval(2000, 100), 1000); // 2% would be 1,000: within 2 min
  assert.equal(nextCheckpointInterval(30, 10), 6000);
  assert.equal(nextCheckpointInterval(0.1, 300), 200);
  assert.equal(nextCheckpointInterval(0, 70_000), 1);     // steps over a minute: every step
  assert.equal(nextCheckpointInterval(10, NaN), 20);    // no step time yet: the first interval
  // A CPU adapter: tiny's state read back in 15 s, 200 ms steps. 2% of training time would
  // be 3,750 steps apart (one checkpoint per short run): at most RISK_MS of steps instead.
  assert.equal(nextCheckpointInterval(15_000, 200), RISK_MS / 200);
  // Slow steps: at most RISK_STEPS steps when they take longer than RISK_MS.
  assert.equal(nextCheckpointInterval(60_000, 5000), RISK_STEPS);
  // Whatever the adapter, a crash loses at most the larger of RISK_STEPS steps and RISK_MS.
  for (const stepMs of [1, 7, 50, 200, 900, 3000, 20_000]) {
    for (const ckptMs of [1, 100, 2000, 15_000, 120_000]) {
      const n = nextCheckpointInterval(ckptMs, stepMs);
      assert.ok(n >= 1 && n <= Math.max(RISK_STEPS, Math.ceil(RISK_MS / stepMs)), `${ckptMs} ${stepMs}`);
    }
  }
  assert.equal(median([5, 1, 3]), 3);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.ok(Number.isNaN(median([])));
});

test('digests are lowercase hex SHA-256', async () => {
  assert.equal(toHex(new Uint8Array([0, 15, 16, 255]).buffer), '000f10ff');
  const data = new Uint8Array(1000).map((_, i) => (i * 31) & 255);
  assert.equal(await sha256Hex(data.buffer), createHash('sha256').update(data).digest('hex'));
});
