// "Did the room help?" (static/js/app/room_series.js): the room's global eval loss, each
// worker's training loss and the lone tab's on one axis of tokens each worker trained.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { compareAt, helpedSeries, helpedText, tokensPerStep, versionTokens } from '../../static/js/app/room_series.js';

const config = { batch_size: 2, seq_len: 32 };          // 64 tokens a step
const room = (evals, H = 3) => ({ config: { inner_steps: H }, evals });
const ev = (version, median) => ({ version, median, outliers: [] });
const rep = (version, worker, losses, evalLoss = null) => ({ version, worker, losses, eval_loss: evalLoss });

test('tokens: a version is v x H steps of each worker, of batch x context tokens', () => {
  assert.equal(tokensPerStep(config), 64);
  assert.equal(versionTokens(0, 3, config), 0);
  assert.equal(versionTokens(2, 3, config), 384);
});

test('the global eval loss sits at v x H x B x T, each worker\'s inner step s of v at (v x H + s + 1) x B x T', () => {
  const reports = [rep(0, 1, [6, 5.5, 5.2]), rep(0, 0, [6.1, 5.6, 5.1]), rep(1, 0, [5.0, 4.9, 4.8])];
  const out = helpedSeries(room([ev(0, 6.2), ev(1, 5.0), ev(2, 4.7)]), reports, config);
  assert.deepEqual(out.series.map((s) => s.key), ['global', 'worker 0', 'worker 1']);
  assert.deepEqual(out.series.map((s) => s.worker), [undefined, 0, 1]);
  const [xs, global, w0, w1] = out.cols;
  assert.deepEqual(xs, [0, 64, 128, 192, 256, 320, 384]);
  assert.deepEqual(global, [6.2, null, null, 5.0, null, null, 4.7]);
  assert.deepEqual(w0, [null, 6.1, 5.6, 5.1, 5.0, 4.9, 4.8]);
  assert.deepEqual(w1, [null, 6, 5.5, 5.2, null, null, null]);
  assert.deepEqual(out.counts, { versions: 3, workers: 2, loneEvals: 0, loneSteps: 0 });
  assert.equal(out.compare, null);
  for (const c of out.cols) assert.equal(c.length, xs.length);
});

test('the lone tab\'s step n sits at n x its own batch x context; its eval and training loss are two series', () => {
  const lone = { id: 'abc', config: { batch_size: 4, seq_len: 16 },       // also 64 a step
    records: [{ step: 1, loss: 6.0 }, { step: 2, loss: 5.7 }, { step: 3, loss: 5.5, eval_loss: 5.4 },
      { step: 4, loss: null }, { step: 6, loss: 5.1, eval_loss: 5.0 }] };
  const out = helpedSeries(room([ev(0, 6.2), ev(1, 5.2), ev(2, 4.9)]), [], config, lone);
  assert.deepEqual(out.series.map((s) => s.key), ['global', 'lone eval', 'lone train']);
  const [xs, global, loneEval, loneTrain] = out.cols;
  assert.deepEqual(xs, [0, 64, 128, 192, 384]);            // (step 4 has no loss: no x)
  assert.deepEqual(global, [6.2, null, null, 5.2, 4.9]);
  assert.deepEqual(loneEval, [null, null, null, 5.4, 5.0]);
  assert.deepEqual(loneTrain, [null, 6.0, 5.7, 5.5, 5.1]);
  assert.deepEqual(out.counts, { versions: 3, workers: 0, loneEvals: 2, loneSteps: 4 });
  // Both measured at 384 tokens each: the room is 0.1 lower there.
  assert.deepEqual(out.compare, { room: [384, 4.9], lone: [384, 5.0], same: true });
  assert.equal(helpedText(out, true), 'At 384 tokens each worker trained, the room\'s global ' +
    'eval loss is 4.9 and one tab alone\'s 5: the room is 0.1 lower: it helped.');
});

test('another batch or context moves the lone tab\'s tokens; without a common x the nearest eval is named', () => {
  const lone = { id: 'abc', config: { batch_size: 1, seq_len: 32 },
    records: [{ step: 5, loss: 5.3, eval_loss: 5.3 }] };
  const out = helpedSeries(room([ev(0, 6.2), ev(1, 5.2)]), [], config, lone);
  assert.deepEqual(out.cols[0], [0, 160, 192]);
  assert.deepEqual(out.compare, { room: [192, 5.2], lone: [160, 5.3], same: false });
  assert.equal(helpedText(out, true), 'The room\'s global eval loss is 5.2 at 192 tokens each ' +
    'worker trained; one tab alone\'s is 5.3 at 160 tokens.');
});

test('compareAt: the most tokens both measured, else the lone tab\'s nearest to the room\'s latest', () => {
  const m = (o) => new Map(Object.entries(o).map(([k, v]) => [Number(k), v]));
  assert.deepEqual(compareAt(m({ 0: 6, 100: 5, 200: 4 }), m({ 100: 5.5, 300: 4.5 })),
    { room: [100, 5], lone: [100, 5.5], same: true });
  assert.deepEqual(compareAt(m({ 0: 6, 200: 4 }), m({ 150: 4.4, 250: 4.1 })),
    { room: [200, 4], lone: [150, 4.4], same: false });        // (a tie: the fewer tokens)
  assert.equal(compareAt(m({}), m({ 1: 1 })), null);
  assert.equal(compareAt(m({ 1: 1 }), m({})), null);
});

test('the words: no lone tab, none measured yet, the room higher', () => {
  const none = helpedSeries(room([ev(0, 6.2)]), [], config);
  assert.match(helpedText(none, false), /^No single run on this server trains what one of the room's workers trains/);
  const early = helpedSeries(room([]), [], config, { id: 'a', config, records: [] });
  assert.equal(helpedText(early, true), 'The room has no global eval loss yet.');
  const noLoneEval = helpedSeries(room([ev(0, 6.2)]), [], config,
    { id: 'a', config, records: [{ step: 1, loss: 6 }] });
  assert.equal(helpedText(noLoneEval, true), 'One tab alone has no eval loss yet.');
  const worse = helpedSeries(room([ev(0, 6.2), ev(1, 5.5)], 1), [], config,
    { id: 'a', config, records: [{ step: 1, loss: 5.3, eval_loss: 5.25 }] });
  assert.equal(helpedText(worse, true), 'At 64 tokens each worker trained, the room\'s global ' +
    'eval loss is 5.5 and one tab alone\'s 5.25: the room is 0.25 higher: it has not helped (yet).');
});
