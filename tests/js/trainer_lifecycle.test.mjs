// The Trainer's end of a run (trainer.js, checkpoint_cadence.js) on a stand-in GPU
// (trainer_standin.mjs): a pause and a stop that wait on the same upload hand over one
// checkpoint, not the same one twice; a lost device's run ends only once the checkpoint whose
// bytes were already read back is uploaded, so the page offers to resume from it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fakeDevice, makeTrainer, tick } from './trainer_standin.mjs';

test('pause during a slow upload, then stop: the stop state is read back and handed over once', async () => {
  const delivered = [];
  let release;
  const slow = new Promise((r) => { release = r; });
  const t = makeTrainer({ every: 10, on: { checkpoint: async (ck) => {
    delivered.push(ck.step);
    if (ck.step === 10) {            // the periodic upload takes a while
      t.pause();                     // the user pauses meanwhile ...
      await slow;
    }
  } } });
  const running = t.run();
  while (t.state !== 'paused') await tick();
  const pausedAt = t.done;
  t.stop();                          // ... then stops, the upload of step 10 still going
  await tick(5);
  release();
  assert.equal(await running, 'stopped');
  assert.deepEqual(delivered, [10, pausedAt]);
});

test('a lost device: the run ends stopped once the checkpoint read back before it is uploaded', async () => {
  const device = fakeDevice();
  let uploaded = false;
  const t = makeTrainer({ device, every: 10, on: { checkpoint: async () => {
    device.lose('unknown', 'GPU process crashed');   // the GPU goes while the body uploads
    await tick(50);                                  // (its bytes are in memory already)
    uploaded = true;
  } } });
  assert.equal(await t.run(), 'stopped');
  assert.equal(uploaded, true);
  assert.equal(t.ckpt.saved, 10);                    // what the page's resume offer reads
  assert.equal(t.ckpt.inFlight, null);
});

test('a pause counts in no step\'s step_ms (the page\'s time left is the steps\' wall time)', async () => {
  const records = [];
  const t = makeTrainer({ every: null, on: { record: (r) => records.push(r) } });
  const running = t.run();
  while (records.length < 5) await tick();
  t.pause();
  while (t.state !== 'paused') await tick();
  await tick(400);                                   // the user reads the charts a while
  t.resume();
  assert.equal(await running, 'finished');
  assert.equal(records.length, 40);
  const slowest = Math.max(...records.map((r) => r.step_ms));
  assert.ok(slowest < 200, `a step took ${slowest} ms: the pause counted in it`);
});
