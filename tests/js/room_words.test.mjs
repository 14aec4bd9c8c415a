// A room run's state in words (static/js/app/room_words.js): what the open round waits for,
// what each worker does now, and the room's line in the runs list.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { clock, roomProgress, roomStatus, roundText, workerNow } from '../../static/js/app/room_words.js';

const worker = (id, left = null, extra = {}) => ({ worker: id, left, ...extra });
const room = (open, extra = {}) => ({
  finished: false, version: 2, rounds: 6,
  config: { round_deadline_s: 120, quorum: 1, inner_steps: 50 },
  workers: [worker(0), worker(1), worker(2), worker(3), worker(4, 1.0)],
  open: { received: [], refused: {}, waiting_for: [0, 1, 2, 3], quorum_met: false,
    deadline_at: null, ...open },
  ...extra,
});

test('a round that waits says for how many of its workers, and when it closes', () => {
  const r = room({ received: [0, 1, 2], waiting_for: [3], quorum_met: true, first_at: 1000,
    deadline_at: 1120 });
  assert.equal(roundText(r, 1018), 'Round 3 of 6: waiting for 1 of 4 workers, closes in 1:42.');
  assert.equal(roundText(r, 1121), 'Round 3 of 6: waiting for 1 of 4 workers, closing now (past its deadline).');
});

test('a cut round says the others send what they have trained', () => {
  const r = room({ received: [0, 1], waiting_for: [2, 3], quorum_met: true, first_at: 1000,
    deadline_at: 1120, cut: true });
  assert.equal(roundText(r, 1018), 'Round 3 of 6: cut (half the workers are done): waiting for ' +
    '2 of 4 workers to send what they have trained, closes in 1:42.');
});

test('a round short of its quorum closes only when they send; one with none sent yet says how it closes', () => {
  const short = room({ received: [0], waiting_for: [1, 2, 3], quorum_met: false, deadline_at: 1120 },
    { config: { round_deadline_s: 120, quorum: 2, inner_steps: 50 } });
  assert.match(roundText(short, 1000), /^Round 3 of 6: waiting for 3 of 4 workers, it needs 2 pseudo-gradients/);
  assert.equal(roundText(room({}), 0), 'Round 3 of 6: 4 workers training; it closes once each has ' +
    'sent its pseudo-gradient, or 2:00 after the first one.');
  assert.equal(roundText(room({}, { workers: [worker(0, 5)] }), 0),
    'Round 3 of 6: no worker trains it now; it goes on when one joins.');
  assert.equal(roundText(room({}, { finished: true, version: 6 }), 0),
    'All 6 rounds closed: the room is finished.');
});

test('each worker now: training step k of H, sending, waiting, left', () => {
  assert.equal(workerNow({ state: 'training', step: 7 }, 50), 'training (step 7 of 50)');
  assert.equal(workerNow({ state: 'sending', step: 50 }, 50), 'sending its pseudo-gradient');
  assert.equal(workerNow({ state: 'waiting', step: 50 }, 50), 'waiting for the round to close');
  assert.equal(workerNow({ state: 'left' }, 50), 'left');
  assert.equal(workerNow({ state: 'left', removed: true }, 50), 'removed');
  assert.equal(clock(3723), '1:02:03');
});

test('the runs list: rounds closed of all, and its workers now (none once finished)', () => {
  assert.equal(roomProgress({ version: 2, rounds: 6 }), '2 / 6 rounds (33 %)');
  assert.equal(roomStatus({ finished: false, training: 3, joined: 4 }), 'running · 3 workers training');
  assert.equal(roomStatus({ finished: false, training: 0, joined: 4 }), 'running · no worker training');
  assert.equal(roomStatus({ finished: true, training: 0, joined: 4 }), 'finished · 4 workers trained it');
});
