// The room worker's network edge cases (static/js/engine/room_worker.js), with a stand-in
// Trainer: a version pruned before this worker downloaded it (the room moved on while it
// waited) is replaced by the room's newest, and the next round starts from that one; version 0
// is the server's like any other, downloaded and never published; each report carries how the
// worker spent its version (wait, download, eval, train, send).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RoomWorker } from '../../static/js/engine/room_worker.js';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function worker(kept, newest) {
  const asked = [];
  const room = {
    weights: async (v) => { asked.push(v); return kept.includes(v) ? new Float32Array([v]).buffer : null; },
    nextVersion: async () => newest.shift(),    // what the room says at each ask
    send: async () => {},
    report: async () => {},
  };
  const w = new RoomWorker({ config: { room: { inner_steps: 4, codec: 'f32' } }, room });
  w.rounds = 10;
  const loaded = [];
  w.trainer = {
    setWeights: (weights) => loaded.push(weights[0]),
    evalLoss: async () => 1.5,
    model: { getParams: async () => new Float32Array([0]) },
  };
  return { w, asked, loaded };
}

test('a version no longer kept is replaced by the newest, and the round goes on from it', async () => {
  const { w, asked, loaded } = worker([5, 6], [4, 6]);
  await w.take(6);
  assert.equal(w.version, 6);
  w.version = 3;                       // this worker trained version 3; the room is at 6 now
  w.global = new Float32Array([3]);
  const next = await w.endRound(4 * 4);   // version 3's round, its 4 steps done
  assert.deepEqual(asked.slice(1), [4, 6]);   // 4 (the next after 3) is gone: the newest
  assert.equal(w.version, 6);
  assert.deepEqual(loaded, [6, 6]);
  assert.equal(next, 6 * 4);           // the Trainer's step: version 6's first inner step
});

test('version 0 (the server made it from the run\'s seed) is downloaded like any version', async () => {
  const { w, asked, loaded } = worker([0], []);
  w.room.publish = async () => assert.fail('a worker never publishes weights');
  await w.take(0);
  assert.deepEqual(asked, [0]);
  assert.deepEqual(loaded, [0]);        // the room's weights, not this worker's seeded ones
  assert.equal(w.version, 0);
  assert.equal(w.evalLoss, 1.5);
});

test('leaving while the round waits for the others ends the wait at once', async () => {
  // A round that cannot close without the others (their batches held, a slow laptop): the
  // leaving worker's wait for the next version ends with stop(), not with the round.
  const { w } = worker([3], []);
  let asks = 0;
  w.room.nextVersion = async (after, signal) => {
    for (;;) {                        // the page's polling loop: the room never moves on here
      if (signal?.aborted) return null;
      asks++;
      await new Promise((r) => setTimeout(r, 5));
    }
  };
  let stopped = null;
  w.trainer.stop = (reason) => { stopped = reason; };
  await w.take(3);
  const ended = w.endRound(4 * 4);
  await new Promise((r) => setTimeout(r, 30));
  assert.ok(asks > 0);                // it was waiting
  w.stop('left the room');
  assert.equal(await ended, undefined);   // no next step: the Trainer stops where it is
  assert.equal(stopped, 'left the room');
  assert.equal(w.version, 3);         // nothing newer was taken
});

test('each report says how the worker spent its version, the wait for a slow round included', async () => {
  // Version 3 taken at the join, trained, sent; the round closes slowly; version 4 (the room's
  // last) taken. Version 3's report carries its train and send and the take that started it
  // (no wait: the join's); the last version's report carries the slow wait, its download and
  // eval, and no training.
  const { w } = worker([3, 4], []);
  w.rounds = 4;
  const reports = [];
  w.room.report = async (v, losses, evalLoss, timings) => { reports.push({ v, losses, timings }); };
  w.room.nextVersion = async () => { await sleep(60); return 4; };
  w.trainer.evalLoss = async () => { await sleep(5); return 1.5; };
  await w.take(3);
  await sleep(30);                     // its inner steps
  w.losses = [2.0, 1.9, 1.8, 1.7];
  assert.equal(await w.endRound(4 * 4), 4 * 4);   // the Trainer's end
  assert.deepEqual(reports.map((r) => [r.v, r.losses.length]), [[3, 4], [4, 0]]);
  const phases = ['wait_ms', 'download_ms', 'eval_ms', 'train_ms', 'send_ms'];
  for (const { timings } of reports) {
    assert.deepEqual(Object.keys(timings).sort(), [...phases].sort());
    for (const k of phases) assert.ok(Number.isFinite(timings[k]) && timings[k] >= 0, k);
  }
  const [first, last] = reports.map((r) => r.timings);
  assert.equal(first.wait_ms, 0);      // the join's version: nothing waited for
  assert.ok(first.train_ms >= 25, `train ${first.train_ms}`);
  assert.ok(first.eval_ms >= 6, `eval ${first.eval_ms}`);   // two eval batches
  assert.ok(last.wait_ms >= 50, `wait ${last.wait_ms}`);    // the slow round's close
  assert.ok(last.eval_ms >= 6, `eval ${last.eval_ms}`);
  assert.equal(last.train_ms, 0);      // nobody trains the last version
  assert.equal(last.send_ms, 0);
});

test('a round the room cut sends the steps it took, and the next starts at the next version', async () => {
  // wait_for_slowest off: half the room sent a whole round, so this slow worker, 2 of its 4
  // steps into version 3, ends its round there (the Trainer asks early() after each step).
  const { w } = worker([3, 4], [4]);
  const sent = [];
  w.room.send = async (v, body, steps) => { sent.push({ v, steps }); };
  w.room.cut = (v) => v === 3;
  await w.take(3);
  assert.equal(await w.endRound(3 * 4 + 2), 4 * 4);   // version 4's first inner step
  assert.deepEqual(sent, [{ v: 3, steps: 2 }]);
  assert.equal(w.version, 4);
  assert.equal(w.room.cut(w.version), false);   // version 4's round is whole again
});

test('an int8 room\'s worker takes the next version as an update of the one it holds', async () => {
  const { w, asked, loaded } = worker([2, 3, 7], []);
  w.config.room.codec = 'int8';
  const updates = [];
  w.room.update = async (v) => { updates.push(v); return v === 3 ? update(2, 3) : null; };
  await w.take(2);                       // nothing held yet: the weights
  assert.deepEqual([asked, updates], [[2], []]);
  await w.take(3);                       // holds 2: 3 comes as 2 plus its update
  assert.deepEqual([asked, updates], [[2], [3]]);
  assert.deepEqual(loaded, [2, 3]);
  assert.equal(w.global[0], 3);
  w.version = 5;                         // behind (holds 5, the room's update is of 7): weights
  w.room.update = async () => assert.fail('only the version after the one held is an update');
  await w.take(7);
  assert.deepEqual([asked, loaded], [[2, 7], [2, 3, 7]]);
});

/** An int8 update of a one-element model from `from` to `to` (room_codec.js's format). */
function update(from, to) {
  const body = new ArrayBuffer(4 + 1);
  new Float32Array(body, 0, 1)[0] = (to - from) / 127;
  new Int8Array(body, 4, 1)[0] = 127;
  return body;
}

/** An overlapped worker of `rounds` rounds of 4 inner steps on `room`, with a stand-in
 *  Trainer whose model holds m.cur (each setWeights also logged in m.set) and whose eval loss
 *  is the model's first weight. */
function overlapped(room, rounds, codec = 'f32') {
  const m = { cur: new Float32Array([0]), set: [] };
  const w = new RoomWorker({ config: { room: { inner_steps: 4, codec, overlap: true } }, room });
  w.rounds = rounds;
  w.trainer = {
    done: 0,
    setWeights: (x) => { m.cur = Float32Array.from(x); m.set.push([...m.cur]); },
    evalLoss: async () => m.cur[0],    // the eval of whatever the model holds now
    model: { getParams: async () => Float32Array.from(m.cur) },
  };
  return { w, m };
}

const arrived = async (w) => { while (!w.arrived) await sleep(1); };

test('overlapped, a worker trains on while the round closes and moves its steps onto the version', async () => {
  // H 4, three rounds, f32. Round 0 ends at e0 = [1, 2]: its pseudo-gradient goes up and
  // training goes on at once (endRound does not wait for version 1). Version 1 arrives two
  // steps later: the weights become version 1 + (weights - e0), its eval measured on version 1
  // itself. Round 1's pseudo-gradient is version 1 minus the weights, as always. Version 2 is
  // late: round 2's end waits for it there, and the last round ends without overlap.
  const released = new Map();          // version -> resolve(): the room has made it
  const made = (v) => new Promise((r) => released.set(v, r)).then(() => v);
  const versions = { 0: [0, 0], 1: [10, 20], 2: [5, 5], 3: [7, 7] };
  const sent = [];
  const reports = [];
  const pending = { 1: made(1), 2: made(2), 3: made(3) };
  const { w, m } = overlapped({
    weights: async (v) => new Float32Array(versions[v]).buffer,
    nextVersion: async (after) => pending[after + 1],
    send: async (v, body) => { sent.push([v, [...new Float32Array(body)]]); },
    report: async (v, losses, evalLoss) => { reports.push([v, losses.length, evalLoss]); },
  }, 3);
  await w.take(0);
  m.cur = new Float32Array([1, 2]);    // round 0 trained: e0
  w.losses = [3, 3, 3, 3];
  assert.equal(await w.atSync(4), undefined);   // not waiting for version 1: train on
  await sleep(1);
  assert.deepEqual(sent, [[0, [-1, -2]]]);      // version 0 minus e0
  assert.equal(w.arrived, false);
  m.cur = new Float32Array([1.5, 2.5]);   // two steps of round 1
  assert.equal(await w.atSync(6), undefined);   // (no version yet: nothing happens)
  assert.deepEqual(m.set.length, 1);
  released.get(1)();
  await arrived(w);
  w.trainer.done = 6;
  assert.equal(await w.atSync(6), undefined);   // the Trainer asked early(): the version is here
  assert.deepEqual(m.set.slice(1), [[10, 20], [10.5, 20.5]]);   // eval on it, then moved onto it
  assert.deepEqual([w.version, w.evalLoss], [1, 10]);
  m.cur = new Float32Array([11, 21]);  // round 1's end
  w.losses = [2, 2, 2, 2];
  assert.equal(await w.atSync(8), undefined);
  await sleep(1);
  assert.deepEqual(sent[1], [1, [-1, -1]]);     // version 1 minus the weights
  m.cur = new Float32Array([12, 23]);  // round 2 (the last) trained; version 2 still not made
  w.trainer.done = 12;
  const end = w.atSync(12);
  await sleep(1);
  assert.equal(sent.length, 2);        // waiting for version 2 before its pseudo-gradient
  released.get(2)();
  await sleep(1);
  released.get(3)();
  assert.equal(await end, 12);         // the room's last version taken: the Trainer's end
  // Round 2 moved onto version 2 at its end: 5 + ([12, 23] - [11, 21]) = [6, 7], sent as
  // version 2 minus that.
  assert.deepEqual(sent[2], [2, [-1, -2]]);
  assert.deepEqual(w.moves, [{ version: 1, step: 6 }, { version: 2, step: 12 }]);
  assert.deepEqual(reports, [[0, 4, 0], [1, 4, 10], [2, 0, 5], [3, 0, 7]]);
});

test('overlapped, a worker whose round the room closed without it starts the newest version', async () => {
  // Round 1's pseudo-gradient went up, but the room closed versions 2 and 3 without this
  // worker's round 2 (a deadline): the version that comes is 3, so round 2's steps are dropped
  // and the Trainer goes to version 3's first step, from version 3 itself.
  const { w, m } = overlapped({
    weights: async (v) => new Float32Array([v * 10]).buffer,
    nextVersion: async () => 3,
    send: async () => {},
    report: async () => {},
  }, 5);
  await w.take(1);
  m.cur = new Float32Array([11]);
  assert.equal(await w.atSync(8), undefined);      // round 1 sent; round 2 trains on
  await arrived(w);
  w.losses = [1, 1];
  w.trainer.done = 10;
  assert.equal(await w.atSync(10), 3 * 4);         // version 3's first inner step
  assert.deepEqual([w.version, w.evalLoss, w.losses, m.set], [3, 30, [], [[10], [30]]]);
  assert.deepEqual(w.moves, []);                   // nothing moved: a fresh start
});

test('overlapped in an int8 room, the next version comes as an update of the one held', async () => {
  const asked = [];
  const { w, m } = overlapped({
    weights: async (v) => { asked.push(`weights ${v}`); return new Float32Array([v]).buffer; },
    update: async (v) => { asked.push(`update ${v}`); return update(v - 1, v); },
    nextVersion: async (after) => after + 1,
    send: async () => {},
    report: async () => {},
  }, 3, 'int8');
  await w.take(0);
  m.cur = new Float32Array([0.5]);
  await w.atSync(4);
  await arrived(w);
  m.cur = new Float32Array([0.75]);    // a step of round 1 from e0 = 0.5
  w.trainer.done = 5;
  await w.atSync(5);
  assert.deepEqual(asked, ['weights 0', 'update 1']);   // version 0 plus its update
  assert.deepEqual([w.version, w.global[0], m.cur[0]], [1, 1, 1.25]);
});

test('overlapped, the CPU move is f32 arithmetic, as 14_room_move.wgsl is on the GPU', async () => {
  // e0 = 1, and a step later the weights are 1e-8: the steps since are f32(1e-8 - 1) = -1, so
  // the move onto version 1 (= 1) lands on 0, where f64 arithmetic would keep the 1e-8.
  const { w, m } = overlapped({
    weights: async () => new Float32Array([1]).buffer,
    nextVersion: async (after) => after + 1,
    send: async () => {},
    report: async () => {},
  }, 3);
  await w.take(0);
  m.cur = new Float32Array([1]);       // e0
  await w.atSync(4);
  await arrived(w);
  m.cur = new Float32Array([1e-8]);
  w.trainer.done = 5;
  await w.atSync(5);
  assert.deepEqual([w.version, m.cur[0]], [1, 0]);
});
