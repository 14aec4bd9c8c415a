// Where the training loop's time goes: CPU laps per phase and, with timestamp-query, the GPU's
// time inside steps and between them (trainer.stats.loop; bench/bench_trainer.mjs prints it).

/** Where the loop's time goes (stats.loop), summed over steps: CPU ms waiting for the batch
 *  (prefetch), for a ring slot (the GPU running ahead), writing the batch and the optimizer's
 *  step uniforms, encoding, submitting, reading a slot back (per-source sums, on.record), and
 *  from mapAsync to its resolution; submitting evals, checkpoint copies and samples (which
 *  drain the ring first), and a room worker's rounds (sync: its pseudo-gradient sent, the next
 *  version awaited); with timestamp-query, the GPU's ms inside training steps (first pass
 *  begin to optimizer end) and between consecutive ones (idle, or running an eval, a sample or
 *  checkpoint copies). bench/bench_trainer.mjs prints it. */
export function newLoopProfile() {
  return { steps: 0, batchWaitMs: 0, ringWaitMs: 0, uploadMs: 0, encodeMs: 0, submitMs: 0,
    readMs: 0, mapMs: 0, evalMs: 0, checkpointMs: 0, sampleMs: 0, syncMs: 0, gpuSteps: 0,
    gpuBusyMs: 0, gpuIdleMs: 0 };
}

/** Adds the ms since `t` to prof[key]; -> now. */
export function lap(prof, key, t) {
  const now = performance.now();
  prof[key] += now - t;
  return now;
}

/** The optimizer pass's GPU ms from the step's timestamps [tb, t0, t1] (BigInt ns: the step's
 *  begin, the optimizer pass's begin and end; null when unusable); the step's GPU time and the
 *  idle gap since `last.end` (the previous step's end) go to prof. */
export function addGpuTimes(prof, last, [tb, t0, t1]) {
  if (tb > 0n && t1 > tb) {
    if (last.end !== undefined && tb > last.end) prof.gpuIdleMs += Number(tb - last.end) / 1e6;
    prof.gpuBusyMs += Number(t1 - tb) / 1e6;
    prof.gpuSteps++;
    last.end = t1;
  }
  return t1 > t0 ? Number(t1 - t0) / 1e6 : null;
}
