// The run page's metric columns (static/js/app/series.js): appends, out-of-order inserts,
// repeats, and derived columns that extend instead of rebuilding.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Derived, RunSeries, clipEvents, phaseMarks, runningSmooth } from '../../static/js/app/series.js';

const rec = (step, extra = {}) => ({ step, loss: 10 - step, clip_scale: 1, grad_norm: step, ...extra });

test('in-order records append; repeats replace; late ones are inserted in order', () => {
  const s = new RunSeries(['loss', 'eval_loss']);
  for (const k of [1, 2, 4]) s.add(rec(k));
  assert.equal(s.takeChanged(), 0);
  s.add(rec(5));
  assert.equal(s.takeChanged(), 3);                 // only the new row
  s.add(rec(3));
  assert.deepEqual(s.steps, [1, 2, 3, 4, 5]);
  assert.deepEqual(s.cols.loss, [9, 8, 7, 6, 5]);
  assert.deepEqual(s.cols.eval_loss, [null, null, null, null, null]);
  assert.equal(s.takeChanged(), 2);
  s.add(rec(4, { loss: 0.5 }));                     // the same step again
  assert.deepEqual(s.steps, [1, 2, 3, 4, 5]);
  assert.equal(s.cols.loss[3], 0.5);
  assert.equal(s.takeChanged(), 3);
  assert.equal(s.takeChanged(), 5);                 // nothing since
  assert.equal(s.last.step, 5);
});

test('derived columns see each row once while records arrive in order', () => {
  const s = new RunSeries(['loss']);
  let calls = 0;
  const d = new Derived(() => [], (out, series, i) => { calls += 1; out.push(series.steps[i]); });
  for (let k = 1; k <= 100; k++) {
    s.add(rec(k));
    d.update(s, s.takeChanged());
  }
  assert.equal(calls, 100);
  s.add(rec(0));                                     // out of order: rebuilt once
  d.update(s, s.takeChanged());
  assert.equal(calls, 201);
  assert.deepEqual(d.state.slice(0, 3), [0, 1, 2]);
});

test('runningSmooth equals the whole-column EMA, also after an insert', () => {
  const s = new RunSeries(['loss']);
  const sm = runningSmooth('loss', 0.6);
  const ys = [3, null, 2.5, 2, Infinity, 1.5];
  ys.forEach((y, k) => { if (k !== 2) s.add({ step: k + 1, loss: y }); sm.update(s, s.takeChanged()); });
  s.add({ step: 3, loss: ys[2] });
  const got = sm.update(s, s.takeChanged()).out;
  let m = 0;
  let n = 0;
  const want = ys.map((y) => {
    if (y === null || !Number.isFinite(y)) return null;
    m = 0.6 * m + 0.4 * y;
    n += 1;
    return m / (1 - 0.6 ** n);
  });
  assert.deepEqual(got, want);
  assert.deepEqual(runningSmooth('loss', 0).update(s, 0).out, s.cols.loss);
});

test('phase marks and clip events', () => {
  const s = new RunSeries(['grad_norm', 'clip_scale']);
  [[1, 0, 1], [2, 0, 0.5], [3, 1, 1], [4, null, 0.9], [5, 1, 1], [6, 2, 1]].forEach(([step, phase, clip]) => {
    s.add({ step, phase, clip_scale: clip, grad_norm: step });
  });
  const from = s.takeChanged();
  assert.deepEqual(phaseMarks().update(s, from).marks, [3, 6]);
  const c = clipEvents().update(s, from);
  assert.equal(c.count, 2);
  assert.deepEqual(c.norm, [null, 2, null, 4, null, null]);
});

test('truncateAfter drops the rows after a resume step; derived columns rebuild over them', () => {
  const s = new RunSeries(['loss']);
  const smooth = runningSmooth('loss', 0);
  for (let k = 1; k <= 6; k++) s.add(rec(k));
  assert.equal(smooth.update(s, s.takeChanged()).out.length, 6);
  s.truncateAfter(4);
  assert.deepEqual(s.steps, [1, 2, 3, 4]);
  assert.deepEqual(s.cols.loss, [9, 8, 7, 6]);
  assert.equal(s.last.step, 4);
  s.add(rec(5, { loss: 0.25 }));                    // computed again after the resume
  assert.deepEqual(smooth.update(s, s.takeChanged()).out, [9, 8, 7, 6, 0.25]);
  s.truncateAfter(9);                               // nothing after 9: unchanged
  assert.equal(s.length, 5);
});
