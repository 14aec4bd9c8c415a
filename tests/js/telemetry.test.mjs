// The trainer socket (static/js/app/telemetry.js) against a stand-in WebSocket: records are
// resent after a drop, and a final refusal (1008, 1003) rejects every waiter with the server's
// reason, now and later, instead of leaving the training page waiting forever; the storage
// budget used up (4507) keeps the records and tries again slowly.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import './facts.mjs';
import { STORAGE_BUDGET, STORAGE_RETRY_MS, SocketRefused, TrainerSocket } from '../../static/js/app/telemetry.js';

/** A WebSocket the test drives: open(), receive(msg), close(code, reason). */
class FakeSocket {
  static OPEN = 1;
  static made = [];
  constructor(url) {
    Object.assign(this, { url, readyState: 0, sent: [] });
    FakeSocket.made.push(this);
  }
  send(data) { this.sent.push(JSON.parse(data)); }
  open() { this.readyState = 1; this.onopen?.(); }
  receive(msg) { this.onmessage?.({ data: JSON.stringify(msg) }); }
  close(code = 1000, reason = '') {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
}

const sockets = [];
afterEach(() => {
  sockets.splice(0).forEach((s) => s.close());
  FakeSocket.made = [];
});

function trainerSocket() {
  const states = [];
  const s = new TrainerSocket('r1', 'tok', { WebSocket: FakeSocket, url: 'ws://test/ws/runs/r1',
    onState: (state, why) => states.push([state, why]) });
  sockets.push(s);
  return { s, states, ws: () => FakeSocket.made.at(-1) };
}

const settled = (p) => p.then((v) => ['resolved', v], (e) => ['rejected', e]);
const tick = () => new Promise((r) => setTimeout(r, 0));

test('hello with the token, records after the welcome, waiters resolve on ack and pong', async () => {
  const { s, ws } = trainerSocket();
  ws().open();
  assert.deepEqual(ws().sent, [{ type: 'hello', token: 'tok', last_acked_step: null }]);
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 2 });
  s.push({ step: 1 }); s.push({ step: 2 }); s.push({ step: 3 });
  const acked = s.committed(3);
  const synced = s.sync();
  s.flush();
  assert.deepEqual(ws().sent.slice(1).map((m) => m.type), ['ping', 'metrics', 'metrics']);
  ws().receive({ type: 'ack', step: 3 });
  ws().receive({ type: 'pong' });
  assert.deepEqual(await settled(acked), ['resolved', undefined]);
  assert.deepEqual(await settled(synced), ['resolved', undefined]);
});

test('a revoked token rejects every waiter with the reason, and those made later too', async () => {
  const { s, states, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: 0, records_per_message: 10 });
  s.push({ step: 1 });
  s.flush();
  const waiting = [s.committed(1), s.committed(5), s.sync()].map(settled);
  // The server's error message (whole), then the close (its reason cut at 120 characters).
  const reason = 'this run was resumed elsewhere; this tab\'s token was revoked';
  ws().receive({ type: 'error', message: reason });
  ws().close(1008, reason.slice(0, 20));
  for (const [how, e] of await Promise.all(waiting)) {
    assert.equal(how, 'rejected');
    assert.ok(e instanceof SocketRefused);
    assert.equal(e.code, 1008);
    assert.equal(e.reason, reason);
    assert.match(e.message, /resumed elsewhere/);
  }
  assert.equal(s.failed.reason, reason);
  assert.deepEqual(states.at(-1), ['refused', reason]);
  // Nothing waits on a refused socket: new waiters reject at once, and it does not reconnect.
  assert.equal((await settled(s.committed(9)))[0], 'rejected');
  assert.equal((await settled(s.sync()))[0], 'rejected');
  await new Promise((r) => setTimeout(r, 700));   // past the first retry's 500 ms
  assert.equal(FakeSocket.made.length, 1);
});

test('bad data (1003) is final too; the close frame\'s reason when no error message came', async () => {
  const { s, ws } = trainerSocket();
  const acked = settled(s.committed(1));
  ws().open();
  ws().close(1003, 'records must be objects');
  const [how, e] = await acked;
  assert.equal(how, 'rejected');
  assert.equal(e.code, 1003);
  assert.equal(e.reason, 'records must be objects');
});

test('a dropped connection is retried and its waiters keep waiting', async () => {
  const { s, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 10 });
  s.push({ step: 1 });
  s.flush();
  let done = false;
  const acked = s.committed(1).then(() => { done = true; });
  ws().close(1006, '');
  await tick();
  assert.equal(done, false);
  assert.equal(s.failed, null);
  await new Promise((r) => setTimeout(r, 600));   // the first retry after 500 ms
  assert.equal(FakeSocket.made.length, 2);
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 10 });
  assert.deepEqual(ws().sent.at(-1), { type: 'metrics', records: [{ step: 1 }] });   // resent
  ws().receive({ type: 'ack', step: 1 });
  await acked;
  assert.equal(done, true);
});

test('after a reconnect the last status goes first again (the server may have marked the run interrupted meanwhile)', async () => {
  const { s, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 10 });
  s.send({ type: 'status', status: 'paused' });
  s.push({ step: 1 });
  s.flush();
  ws().close(1006, '');
  await new Promise((r) => setTimeout(r, 600));   // the first retry after 500 ms
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 10 });
  assert.deepEqual(ws().sent.slice(1), [{ type: 'status', status: 'paused' },
    { type: 'metrics', records: [{ step: 1 }] }]);
});

test('a run with no records commits nothing: committed(0) settles at once', async () => {
  const { s, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 10 });
  const outcome = await Promise.race([s.committed(0).then(() => 'resolved'),
    new Promise((r) => setTimeout(() => r('pending'), 200))]);
  assert.equal(outcome, 'resolved');   // (it waited for an ack that never comes)
});

test('a ping lost with a dropped connection is sent again: sync() settles after the reconnect', async () => {
  const { s, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: 3, records_per_message: 10 });
  let done = false;
  s.sync().then(() => { done = true; });
  ws().close(1006, '');                           // dropped before the pong
  await new Promise((r) => setTimeout(r, 600));   // the first retry after 500 ms
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: 3, records_per_message: 10 });
  assert.deepEqual(ws().sent.slice(1), [{ type: 'ping' }]);
  ws().receive({ type: 'pong' });
  await tick();
  assert.equal(done, true);
});

test('"another trainer" (kind busy) is retried a few times before it is final', async () => {
  const { s, ws } = trainerSocket();
  const acked = settled(s.committed(1));
  const busy = () => {
    ws().receive({ type: 'error', message: 'another trainer holds this run', kind: 'busy' });
    ws().close(1008, 'another trainer holds this run');
  };
  ws().open();
  busy();
  await tick();
  assert.equal(s.failed, null);   // this tab's own previous socket may still be counted
  s.busyRetries = 8;              // the retries spent
  s.connect();
  ws().open();
  busy();
  const [how, e] = await acked;
  assert.equal(how, 'rejected');
  assert.equal(e.reason, 'another trainer holds this run');
});

test('records go in messages under half the server\'s byte limit, each whole, in order', async () => {
  const { s, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: null, records_per_message: 100,
    max_message_bytes: 4000 });
  const rows = Array.from({ length: 64 }, (_, i) => 4 + i / 7);   // ~1.2 kB a record
  for (let step = 1; step <= 6; step++) s.push({ step, row_losses: rows });
  s.flush();
  const metrics = ws().sent.filter((m) => m.type === 'metrics');
  assert.ok(metrics.length >= 3, `${metrics.length} messages`);
  for (const m of metrics) assert.ok(JSON.stringify(m).length <= 2000 + 100);
  assert.deepEqual(metrics.flatMap((m) => m.records.map((r) => r.step)), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(metrics[0].records[0].row_losses, rows);
});

test('the storage budget used up (4507): records kept, told, tried again slowly, status resent', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const { s, states, ws } = trainerSocket();
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: 0, records_per_message: 10 });
  s.send({ type: 'status', status: 'running' });
  s.push({ step: 1 }); s.push({ step: 2 });
  s.flush();
  let done = false;
  const acked = s.committed(2).then(() => { done = true; });
  const why = 'disk_floor: the server\'s storage budget is used up: this message was not stored';
  ws().receive({ type: 'error', message: why, kind: 'disk_floor' });
  ws().close(STORAGE_BUDGET, why.slice(0, 120));
  assert.deepEqual(states.at(-1), ['storage', why]);
  assert.equal(s.failed, null);                    // not a refusal: the run goes on
  assert.equal(s.storage, why);
  assert.deepEqual(s.unacked.map((r) => r.step), [1, 2]);
  t.mock.timers.tick(STORAGE_RETRY_MS - 1);
  assert.equal(FakeSocket.made.length, 1);         // no reconnect in a loop
  t.mock.timers.tick(1);
  assert.equal(FakeSocket.made.length, 2);
  ws().open();
  ws().receive({ type: 'welcome', last_committed_step: 0, records_per_message: 10 });
  assert.equal(s.storage, null);
  assert.deepEqual(ws().sent.slice(1), [{ type: 'status', status: 'running' },
    { type: 'metrics', records: [{ step: 1 }, { step: 2 }] }]);
  ws().receive({ type: 'ack', step: 2 });
  await acked;
  assert.equal(done, true);
});
