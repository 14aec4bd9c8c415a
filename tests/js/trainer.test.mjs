// The learning-rate schedule (schedule.js lrAt): linear warmup, then cosine decay to a floor.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { evalAt, lrAt, sampleAt } from '../../static/js/engine/schedule.js';

const cfg = { lr: 1e-3, warmup_steps: 10, steps: 110, min_lr_ratio: 0.1 };
const close = (a, b, msg) => assert.ok(Math.abs(a - b) <= 1e-15 + 1e-12 * Math.abs(b), `${msg}: ${a} vs ${b}`);

test('warmup climbs linearly to lr', () => {
  for (let s = 0; s < 10; s++) close(lrAt(s, cfg), 1e-3 * (s + 1) / 10, `step ${s}`);
});

test('cosine decay from lr to lr * min_lr_ratio', () => {
  for (let s = 10; s < 110; s++) {
    const t = (s - 10) / 100;
    close(lrAt(s, cfg), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + Math.cos(Math.PI * t))), `step ${s}`);
  }
  close(lrAt(10, cfg), 1e-3, 'peak');
  close(lrAt(110, cfg), 1e-4, 'floor at the end');
  close(lrAt(500, cfg), 1e-4, 'floor after the end');
});

test('no warmup: the first step runs at lr', () => {
  close(lrAt(0, { ...cfg, warmup_steps: 0 }), 1e-3, 'first step');
  close(lrAt(109, { ...cfg, warmup_steps: 0 }), 1e-3 * (0.1 + 0.45 * (1 + Math.cos(Math.PI * 109 / 110))), 'last step');
});

// The eval and sample schedule (schedule.js evalAt, sampleAt): a pure function of (step, config),
// so a resumed run evaluates and samples exactly where the uninterrupted one did.
const stepsWhere = (fn, config) => Array.from({ length: config.steps }, (_, i) => i + 1)
  .filter((n) => fn(n, config));

test('a short run with the defaults samples early and at its last step, and evaluates at the end', () => {
  const short = { steps: 30, sample_every: 100, eval_every: 50 };
  assert.deepEqual(stepsWhere(sampleAt, short), [7, 30]);   // a quarter of the way, and the end
  assert.deepEqual(stepsWhere(evalAt, short), [30]);
});

test('the default 200-step run samples at 50, 100 and 200 and evaluates at 50, 100, 150, 200', () => {
  const run = { steps: 200, sample_every: 100, eval_every: 50 };
  assert.deepEqual(stepsWhere(sampleAt, run), [50, 100, 200]);
  assert.deepEqual(stepsWhere(evalAt, run), [50, 100, 150, 200]);
});

test('a long run keeps its cadence; the last step always samples and evaluates', () => {
  const run = { steps: 1050, sample_every: 100, eval_every: 50 };
  const samples = stepsWhere(sampleAt, run);
  assert.deepEqual(samples.slice(0, 2), [100, 200]);          // no extra early sample
  assert.equal(samples.at(-1), 1050);
  assert.equal(samples.length, 11);
  assert.equal(stepsWhere(evalAt, run).at(-1), 1050);
});

test('tiny runs: the first step can be the early one; nothing twice', () => {
  assert.deepEqual(stepsWhere(sampleAt, { steps: 1, sample_every: 100 }), [1]);
  assert.deepEqual(stepsWhere(sampleAt, { steps: 3, sample_every: 100 }), [1, 3]);
  assert.deepEqual(stepsWhere(sampleAt, { steps: 8, sample_every: 100 }), [2, 8]);
  assert.deepEqual(stepsWhere(sampleAt, { steps: 30, sample_every: 15 }), [7, 15, 30]);
  assert.deepEqual(stepsWhere(sampleAt, { steps: 30, sample_every: 5 }), [5, 10, 15, 20, 25, 30]);
});

test('0 means never', () => {
  assert.deepEqual(stepsWhere(sampleAt, { steps: 30, sample_every: 0 }), []);
  assert.deepEqual(stepsWhere(evalAt, { steps: 30, eval_every: 0 }), []);
});

test('the schedule is a function of (step, config) alone: a resume at any step agrees', () => {
  const run = { steps: 90, sample_every: 40, eval_every: 25 };
  const whole = stepsWhere(sampleAt, run);
  for (const from of [0, 10, 22, 23, 40, 89]) {
    const resumed = Array.from({ length: run.steps - from }, (_, i) => from + i + 1)
      .filter((n) => sampleAt(n, run));
    assert.deepEqual(resumed, whole.filter((n) => n > from), `resumed after ${from}`);
  }
});
