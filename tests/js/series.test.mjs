// The run page's metric columns (static/js/app/series.js): appends, out-of-order inserts,
// repeats, and derived columns that extend instead of rebuilding.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  Derived, RunSeries, clipEvents, isolatedPoints, phaseMarks, runningSmooth,
} from '../../static/js/app/series.js';

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

test('per-source columns, elapsed time and progress extend row by row', async () => {
  const { sourceColumns, elapsedColumn, progress } = await import('../../static/js/app/series.js');
  const s = new RunSeries(['loss']);
  s.add(rec(1, { time: 100, source_losses: { 0: 5 } }));
  s.add(rec(2, { time: 101, source_losses: { 0: 4, 1: 6 } }));
  s.add(rec(3, { time: 103 }));
  const src = sourceColumns().update(s, 0);
  assert.deepEqual(src.cols, { 0: [5, 4, null], 1: [null, 6, null] });
  assert.deepEqual(elapsedColumn().update(s, 0).out, [0, 1, 3]);
  const p = progress(s, 10);                        // no step_ms: the commit times
  assert.equal(p.step, 3);
  assert.equal(p.perStep, 1.5);
  assert.equal(p.eta, 7 * 1.5);
  assert.equal(p.elapsed, 3);
  s.add(rec(4, { time: 110, step_ms: 1000 }));      // step_ms: its median, not the commit gap
  assert.equal(progress(s, 10).perStep, 1);
});

test('the time left is the measured wall time per step, evals and samples included', async () => {
  const { progress, etaWindow, median } = await import('../../static/js/app/series.js');
  assert.equal(median([]), null);
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  // The window: whole periods of the schedule, at least 50 rows (at most 5000).
  assert.equal(etaWindow({ eval_every: 50, sample_every: 100 }), 100);
  assert.equal(etaWindow({ eval_every: 25, sample_every: 0 }), 50);
  assert.equal(etaWindow({ eval_every: 0, sample_every: 0 }), 50);
  assert.equal(etaWindow({ eval_every: 30, sample_every: 40 }), 120);
  assert.equal(etaWindow({ eval_every: 37, sample_every: 100 }), 3700);
  assert.equal(etaWindow({ eval_every: 997, sample_every: 1000 }), 5000);
  assert.equal(etaWindow(null), 50);
  // 1000 steps of about 100 ms; an eval (1 s) every 50 steps and a sample (3 s) every 100, each
  // in the step_ms of the step after it, as trainer.js measures them; the first step's start-up.
  const cfg = { steps: 1000, eval_every: 50, sample_every: 100 };
  const ms = [];
  for (let step = 1; step <= cfg.steps; step++) {
    ms.push(step === 1 ? 5000 : 100 + (step % 7) * 3 + (((step - 1) % 50 === 0) ? 1000 : 0)
      + (((step - 1) % 100 === 0) ? 3000 : 0));
  }
  const s = new RunSeries(['loss']);
  let t = 0;
  const off = [];
  const perStep = [];
  for (let step = 1; step <= cfg.steps; step++) {
    t += ms[step - 1] / 1000;
    s.add(rec(step, { time: t, step_ms: ms[step - 1] }));
    if (step < 101 || step > 600) continue;   // a full window measured, and 400+ steps left
    const truth = ms.slice(step).reduce((a, b) => a + b, 0) / 1000;
    const p = progress(s, cfg.steps, etaWindow(cfg));
    off.push(p.eta / truth);
    perStep.push(p.perStep);
  }
  // The estimate is the time the steps left will take, within where the next eval or sample
  // falls (a typical step's 109 ms would say 0.69 of it) ...
  assert.ok(Math.min(...off) > 0.94 && Math.max(...off) < 1.06, `${Math.min(...off)} ${Math.max(...off)}`);
  // ... and holds steady as evals and samples enter and leave the window (whole periods).
  assert.ok(Math.max(...perStep) / Math.min(...perStep) < 1.01, `${Math.min(...perStep)} ${Math.max(...perStep)}`);
  const p = progress(s, 2000, etaWindow(cfg));
  // 100 ms + 9 ms of jitter + an eval's 1 s / 50 + a sample's 3 s / 100.
  assert.ok(Math.abs(p.perStep - 0.159) < 0.001, String(p.perStep));
  // Early, the first step's start-up is no step's time: 3 rows measure the other 2.
  const early = new RunSeries(['loss']);
  [5000, 100, 120].forEach((m, i) => early.add(rec(i + 1, { time: i, step_ms: m })));
  assert.equal(progress(early, 10, 100).perStep, 0.11);
});

test('optimizer state per parameter reads as the design says it, 8 and ~2.03', async () => {
  const { fmtBytesPerParam } = await import('../../static/js/app/format.js');
  // The server's bytes_per_param (server/optim.py, 4 decimals): the tiny preset's fp32 m and v
  // over its padded tensors, the 12m's, and 8-bit states.
  assert.equal(fmtBytesPerParam(8.0183), '8.02 B/param');
  assert.equal(fmtBytesPerParam(8), '8 B/param');
  assert.equal(fmtBytesPerParam(2.0312), '2.03 B/param');
  assert.equal(fmtBytesPerParam(3.4461), '3.45 B/param');
  assert.equal(fmtBytesPerParam(2.3463), '2.35 B/param');
});

test('values and ticks keep small numbers readable', async () => {
  const { fmtValue, tickLabels, fmtDuration, fmtBytes } = await import('../../static/js/app/format.js');
  assert.equal(fmtValue(3e-4), '3e-4');
  assert.equal(fmtValue(0.0003123), '3.123e-4');
  assert.equal(fmtValue(5.4321), '5.432');
  assert.equal(fmtValue(0), '0');
  assert.deepEqual(tickLabels([0.0001, 0.0002, 0.0003]), ['1e-4', '2e-4', '3e-4']);
  assert.deepEqual(tickLabels([0.00025, 0.0003]), ['2.5e-4', '3e-4']);
  assert.deepEqual(tickLabels([4, 4.5, 5]), ['4.0', '4.5', '5.0']);
  assert.deepEqual(tickLabels([0, 0.001, 0.002]), ['0', '0.001', '0.002']);
  assert.equal(fmtDuration(200), '3 min 20 s');
  // Rounded before it is split: never "60 s" of a minute or "60 min" of an hour.
  assert.equal(fmtDuration(479.6), '8 min 00 s');
  assert.equal(fmtDuration(59.7), '1 min 00 s');
  assert.equal(fmtDuration(9.97), '10 s');
  assert.equal(fmtDuration(4.24), '4.2 s');
  assert.equal(fmtDuration(7199.9), '2 h 00 min');
  assert.equal(fmtDuration(3599.6), '1 h 00 min');
  assert.equal(fmtDuration(7529), '2 h 05 min');
  for (let x = 0; x < 8000; x += 0.37) assert.doesNotMatch(fmtDuration(x), /\b60 (s|min)/, String(x));
  assert.equal(fmtBytes(92716.2 * 2 ** 20), '90.5 GiB');
});

test('sample text never shows a broken character where a token ends mid-sequence', async () => {
  const { utf8Decoder } = await import('../../static/js/app/text.js');
  const b64 = (bytes) => Buffer.from(bytes).toString('base64');
  const e = [...Buffer.from('é')];            // 2 bytes: 0xc3 0xa9
  const euro = [...Buffer.from('€')];         // 3 bytes
  const table = [b64([...Buffer.from('ab')]), b64([e[0]]), b64([e[1], 0x63]), b64(euro.slice(0, 2)),
    b64([euro[2]]), b64([euro[1], euro[2], 0x64])];
  const decode = utf8Decoder({ token_bytes_b64: table });
  assert.equal(decode([0, 1, 2]), 'abéc');             // split inside one call
  assert.equal(decode([0, 1]), 'ab');                  // the tail waits...
  assert.equal(decode([2]), 'éc');                     // ...for the next piece
  assert.equal(decode([5, 0]), 'dab');                 // orphan continuation bytes dropped
  assert.equal(decode([3]), '');
  assert.equal(decode([0]), 'ab');                     // a stale tail is not glued to new text
  assert.ok(!decode([0, 3, 4, 1]).includes('\ufffd'));
});

test('isolated points: the lone value of a spanned line, the values between gaps of another', () => {
  assert.deepEqual(isolatedPoints([null, null, 4.2, null]), [2]);     // one eval in the run
  assert.deepEqual(isolatedPoints([5.1]), [0]);                       // the first step
  assert.equal(isolatedPoints([null, 4.2, null, 4.0]), null);         // a line joins them
  assert.equal(isolatedPoints([]), null);
  assert.equal(isolatedPoints([null, undefined, NaN]), null);
  assert.deepEqual(isolatedPoints([1, null, 2, 3, null, 4], false), [0, 5]);
  assert.equal(isolatedPoints([1, 2, null, 3, 4], false), null);
});

test('one EMA: smooth() over a column, runningSmooth() over rows or a column kept elsewhere', async () => {
  const { ema, smooth } = await import('../../static/js/app/series.js');
  const ys = [3, null, 2.5, Infinity, 2, 1.5];
  const next = ema(0.6);
  const stepped = ys.map((y) => next(y));
  assert.deepEqual(smooth(ys, 0.6), stepped);
  assert.equal(stepped[1], null);
  assert.ok(Math.abs(stepped[0] - 3) < 1e-12);         // bias-corrected: the first value itself
  assert.equal(smooth(ys, 0), ys);                      // alpha 0: the column as it is
  const s = new RunSeries(['loss']);
  ys.forEach((y, k) => s.add({ step: k + 1, loss: y }));
  assert.deepEqual(runningSmooth('loss', 0.6).update(s, 0).out, stepped);
  const elsewhere = [4, 3, null, 2, 1, 0.5];
  assert.deepEqual(runningSmooth((_s, row) => elsewhere[row], 0.6).update(s, 0).out,
    smooth(elsewhere, 0.6));
});

test('rowOf finds a step by binary search; evalLosses keeps the last and the best', async () => {
  const { evalLosses, rowOf } = await import('../../static/js/app/series.js');
  const s = new RunSeries(['eval_loss']);
  [[2, 5], [4, null], [6, 4], [8, 4.5]].forEach(([step, v]) => s.add({ step, eval_loss: v }));
  assert.deepEqual([2, 4, 8, 1, 5, 9].map((step) => rowOf(s, step)), [0, 1, 3, -1, -1, -1]);
  assert.deepEqual(evalLosses().update(s, 0), { best: 4, last: 4.5, acc: null, bestAcc: null });
  // A toy task run's exact match: the last and the highest.
  const t = new RunSeries(['eval_loss', 'eval_acc']);
  [[2, 5, 0.1], [4, 4, 0.6], [6, 4.5, 0.5]].forEach(([step, v, a]) => t.add({ step, eval_loss: v, eval_acc: a }));
  assert.deepEqual(evalLosses().update(t, 0), { best: 4, last: 4.5, acc: 0.5, bestAcc: 0.6 });
});

test('speed reads in tokens per second, rounded before its unit is picked', async () => {
  const { fmtTokensPerS } = await import('../../static/js/app/format.js');
  assert.equal(fmtTokensPerS(332.4), '332 tokens/s');
  assert.equal(fmtTokensPerS(4.24), '4.2 tokens/s');
  assert.equal(fmtTokensPerS(999.7), '1.0k tokens/s');
  assert.equal(fmtTokensPerS(12_345), '12.3k tokens/s');
  assert.equal(fmtTokensPerS(999_960), '1.00M tokens/s');
  assert.equal(fmtTokensPerS(1_234_567), '1.23M tokens/s');
  assert.equal(fmtTokensPerS(null), '–');
});

test('a sample shows undecodable bytes, control characters and bidi controls as marks', async () => {
  const { MARK_TITLES, sampleParts } = await import('../../static/js/app/text.js');
  assert.deepEqual(sampleParts('plain\ttext\n'), [{ text: 'plain\ttext\n' }]);
  assert.deepEqual(sampleParts(''), []);
  const parts = sampleParts('a\ufffdb\u0000c\u001b\u007f\u0085\u202ed');
  assert.deepEqual(parts.map((p) => [p.text, p.mark]), [
    ['a', undefined], ['\ufffd', 'undecodable'], ['b', undefined], ['\u2400', 'control'],
    ['c', undefined], ['\u241b', 'control'], ['\u2421', 'control'], ['U+0085', 'control'],
    ['\ufffd', 'bidi'], ['d', undefined]]);
  assert.equal(parts[1].title, MARK_TITLES.undecodable);
  assert.match(parts[1].title, /not valid UTF-8/);
  assert.equal(parts[5].title, `${MARK_TITLES.control} (U+001B)`);
  assert.equal(parts[8].title, `${MARK_TITLES.bidi} (U+202E)`);
  // Nothing that could reorder or hide text is left as it was.
  assert.doesNotMatch(parts.map((p) => p.text).join(''), /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202e]/);
});
