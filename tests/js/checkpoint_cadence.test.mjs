// The automatic checkpoint cadence (every === null, engine/checkpoint_cadence.js): a crash loses
// at most a tenth of the run's steps or two minutes of training, whichever is less, while
// checkpoints stay a small share of training time. The rule alone (nextAutoCheckpoint), the
// CheckpointCadence driven on a simulated clock (the read back and the upload take the time a GPU
// measured, bench/results/checkpoint_cadence.txt; one in flight at a time), and a Trainer on the
// stand-in GPU (trainer_standin.mjs) that hands the cadence its run's steps.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CheckpointCadence, FIRST_AUTO_CHECKPOINT, MAX_SHARE, RISK_MS, RUN_SHARE,
  nextAutoCheckpoint }
  from '../../static/js/engine/checkpoint_cadence.js';
import { config, makeTrainer } from './trainer_standin.mjs';

// Measured (bench/results/checkpoint_cadence.txt): step time, read back, upload, in ms.
const H200_12M = { stepMs: 27.3, readMs: 520, uploadMs: 810 };
const H200_120M = { stepMs: 202.9, readMs: 3940, uploadMs: 6670 };
const SWIFTSHADER_TINY = { stepMs: 2871.6, readMs: 10_600, uploadMs: 280 };

/**
 * A run of runSteps steps of stepMs each through a CheckpointCadence on a simulated clock: a
 * snapshot resolves readMs after it is taken, its upload uploadMs after that. -> {steps (taken),
 * readMs (their sum), trainMs, atRisk: the most steps (and ms) a crash could lose: the steps run
 * since the last checkpoint whose upload had completed}.
 */
async function simulate({ runSteps, stepMs, readMs, uploadMs, start = 0 }) {
  let now = 0;
  let done = start;
  const events = [];
  const later = (ms, value) =>
    new Promise((r) => events.push({ at: now + ms, fire: () => r(value) }));
  const flush = () => new Promise((r) => setImmediate(r));
  const fire = async () => {
    events.sort((a, b) => a.at - b.at);
    const e = events.shift();
    now = Math.max(now, e.at);
    e.fire();
    await flush();
  };
  const steps = [];
  let saved = start;                   // the last step whose upload completed
  let atRisk = 0;
  const cad = new CheckpointCadence({ sections: [], chunk_bytes: 4, every: null }, {
    device: null, done: () => done, sections: () => [], recordOf: async () => {},
    isBad: () => false, stats: { checkpoints: 0, checkpointErrors: 0 },
    runSteps: () => runSteps,
    deliver: async (ck) => {
      await later(uploadMs);
      atRisk = Math.max(atRisk, Math.floor(now / stepMs) + start - saved);
      saved = ck.step;
    } });
  cad.snapshot = () => {
    steps.push(done);
    return later(readMs, { step: done, readMs, hashMs: 0 });
  };
  cad.start(start, start > 0);
  for (let s = start + 1; s <= runSteps; s++) {
    const t = now + stepMs;
    while (events.length && Math.min(...events.map((e) => e.at)) <= t) await fire();
    now = t;
    done = s;
    cad.recordStepMs(stepMs);
    cad.maybe();
  }
  let ended = false;
  const end = cad.ifDue().then(() => { ended = true; });
  while (!ended) {
    if (events.length) await fire();
    else await flush();
  }
  await end;
  atRisk = Math.max(atRisk, runSteps - saved);   // a crash just before the run's end
  return { steps, readMs: steps.length * readMs, trainMs: (runSteps - start) * stepMs,
    atRisk, atRiskMs: atRisk * stepMs };
}

const tenths = (n, every) => Array.from({ length: n / every }, (_, i) => (i + 1) * every);

test('the rule: a 200-step run is due at every multiple of 20, at any step speed and cost', () => {
  for (const stepMs of [NaN, 0.5, 27.3, 202.9, 2871.6, 70_000]) {
    for (const ckptMs of [NaN, 0, 520, 3940, 10_600, 120_000]) {
      for (const step of [0, 1, 19, 20, 37, 124, 180, 199]) {
        const next = nextAutoCheckpoint(step, { runSteps: 200, stepMs, ckptMs });
        assert.ok(next > step && next <= (Math.floor(step / 20) + 1) * 20,
          `${step} ${stepMs} ${ckptMs}: ${next}`);
      }
    }
  }
  // Before any step time: 20 steps or a tenth, whichever is first; resumed at 124: at 140.
  assert.equal(nextAutoCheckpoint(0, { runSteps: 200, stepMs: NaN }), 20);
  assert.equal(nextAutoCheckpoint(0, { runSteps: 50, stepMs: NaN }), 5);
  assert.equal(nextAutoCheckpoint(124, { runSteps: 200, stepMs: NaN }), 140);
  assert.equal(nextAutoCheckpoint(0, { runSteps: 100_000, stepMs: NaN }), FIRST_AUTO_CHECKPOINT);
  // Long runs: a minute apart when cheap (ckptMs <= 1.2 s), 50 x ckptMs (~2%) up to 2 minutes,
  // then 2 minutes (a dearer checkpoint costs up to 10%), then ckptMs / MAX_SHARE.
  const interval = (stepMs, ckptMs) =>
    nextAutoCheckpoint(1000, { runSteps: 1e9, stepMs, ckptMs }) - 1000;
  assert.equal(interval(100, 500), 600);                   // a minute
  assert.equal(interval(100, 2000), 1000);                 // 100 s: 2%
  assert.equal(interval(100, 4000), RISK_MS / 100);        // 2 min: 3.3%
  assert.equal(interval(100, 40_000), 40_000 / MAX_SHARE / 100);   // 400 s: 10%
  assert.equal(interval(70_000, 500), 1);                  // steps over a minute: every step
  assert.equal(interval(2871.6, 10_600), 42);              // SwiftShader: 2 min of steps
  // No run length (a caller that gives none): no bound by steps.
  assert.equal(nextAutoCheckpoint(0, { runSteps: undefined, stepMs: 100, ckptMs: 500 }), 600);
});

test('a 200-step run: a checkpoint every 20 steps, as the upload allows', async () => {
  // SwiftShader's tiny: a checkpoint is read back and uploaded within 20 steps.
  const swift = await simulate({ runSteps: 200, ...SWIFTSHADER_TINY });
  assert.deepEqual(swift.steps, tenths(200, 20));
  // A crash loses at most 20 steps and the last one's read back and upload (4 steps' time).
  assert.equal(swift.atRisk, 23);
  // A resume after a crash at step 124 starts from 120 (the cadence before: from 20).
  assert.deepEqual((await simulate({ runSteps: 200, start: 120, ...SWIFTSHADER_TINY })).steps,
    [140, 160, 180, 200]);
  // An H200: 12m's 20 steps take 0.5 s, its read back and upload 1.3 s; 120m's 4 s and 10.6 s.
  // One is in flight at a time, so a due one waits for it and is taken at the first step after:
  // five all the same (the cadence before: one, at 20).
  const fast = await simulate({ runSteps: 200, ...H200_12M });
  assert.deepEqual(fast.steps, [20, 69, 118, 167, 200]);
  assert.deepEqual((await simulate({ runSteps: 200, ...H200_120M })).steps,
    [20, 73, 126, 179, 200]);
  // A crash loses at most two read backs and uploads' time beyond the 20 steps: 2.6 s here.
  const busy = Math.ceil((H200_12M.readMs + H200_12M.uploadMs) / H200_12M.stepMs);
  assert.ok(fast.atRisk <= 20 + 2 * busy && fast.atRiskMs < 3000, `${fast.atRisk} ${busy}`);
});

test('a slow run checkpoints by time: two minutes of steps, not a tenth of the run', async () => {
  const r = await simulate({ runSteps: 2000, ...SWIFTSHADER_TINY });   // 96 min of training
  const gaps = r.steps.map((s, i) => s - (r.steps[i - 1] ?? 0));
  assert.equal(gaps[0], FIRST_AUTO_CHECKPOINT);
  // 2 min of steps (42), or up to a tenth of the run (the multiples of 200 are kept too).
  assert.ok(r.steps.every((s, i) => !i || gaps[i] === 42 || (s % 200 === 0 && gaps[i] < 42)),
    JSON.stringify(gaps));
  for (const s of tenths(2000, 200)) assert.ok(r.steps.includes(s), `${s}`);
  // A crash loses at most two minutes of steps and one checkpoint's read back and upload.
  const { stepMs, readMs, uploadMs } = SWIFTSHADER_TINY;
  assert.ok(r.atRiskMs <= RISK_MS + stepMs + readMs + uploadMs, `${r.atRiskMs}`);
  assert.ok(r.readMs / r.trainMs < 0.1);   // 10.6 s of read back every 2 minutes: 8.8%
});

test('a fast huge run: checkpoints a minute apart, their cost a bounded share', async () => {
  // 12m on an H200 for 10^6 steps (7.6 h): cheap checkpoints, a minute apart, ~0.9% of the time.
  const r = await simulate({ runSteps: 1_000_000, ...H200_12M });
  const minute = Math.ceil(60_000 / H200_12M.stepMs);
  assert.ok(r.steps.slice(1).every((s, i) => s - r.steps[i] === minute ||
    (s % 100_000 === 0 && s - r.steps[i] < minute)));   // and at each tenth of the run
  assert.ok(r.steps.length <= 7.6 * 60 + 11 && r.readMs / r.trainMs < 0.01,
    `${r.steps.length} ${r.readMs / r.trainMs}`);
  assert.ok(r.atRiskMs <= RISK_MS, `${r.atRiskMs}`);
  // 120m: 4 s read backs 2 minutes apart (3.3%); a hypothetical dear one (40 s at 100 ms steps):
  // 400 s apart, 10% of the time, rather than 2 minutes apart at 33%.
  const big = await simulate({ runSteps: 100_000, ...H200_120M });
  assert.ok(big.readMs / big.trainMs < 0.035 && big.atRiskMs <= RISK_MS + 11_000);
  // (Besides: the checkpoints at each tenth of the run, RUN_SHARE of them at most.)
  const dear = await simulate({ runSteps: 200_000, stepMs: 100, readMs: 40_000, uploadMs: 60_000 });
  assert.ok(dear.readMs / dear.trainMs <= MAX_SHARE + RUN_SHARE * 40_000 / dear.trainMs,
    `${dear.readMs / dear.trainMs}`);
  assert.ok(dear.atRiskMs <= 40_000 / MAX_SHARE + 100_000, `${dear.atRiskMs}`);
});

test('a Trainer hands the cadence its run\'s steps: 200 steps on the stand-in GPU', async () => {
  const delivered = [];
  const t = makeTrainer({ every: null, cfg: config({ steps: 200 }), on: { checkpoint: (ck) => {
    delivered.push(ck.step);
  } } });
  assert.equal(await t.run(), 'finished');
  // One in each tenth of the run (at 20, 40, ..., or a step or two after when the one before is
  // still in flight on a busy machine); without the run's steps: one, at 20 (a minute of steps).
  assert.deepEqual(delivered.map((s) => Math.floor(s / 20)), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  assert.equal(delivered.at(-1), 200);
});
