// The run's schedule: learning rate per step, and the steps that end with a sample or an eval.
// Pure functions of (step, config), so a resumed run follows the uninterrupted one exactly.

/** Learning rate at 0-based `step`: linear warmup, then cosine decay to lr * min_lr_ratio. */
export function lrAt(step, { lr, warmup_steps: warmup, steps, min_lr_ratio: floor }) {
  if (step < warmup) return lr * (step + 1) / warmup;
  const span = Math.max(1, steps - warmup);
  const t = Math.min(1, (step - warmup) / span);
  return lr * (floor + (1 - floor) * 0.5 * (1 + Math.cos(Math.PI * t)));
}

/** Whether the step with 1-based number `n` ends with a text sample: every `sample_every` steps,
 *  at the last step, and once early. The early-sample rule: the first sample comes after
 *  min(sample_every, max(1, floor(steps / 4))) steps, so a run shorter than a few
 *  `sample_every` shows its text early (a quarter of the way) and at its end; e.g. 30 steps
 *  with the default 100: steps 7 and 30. sample_every 0: never. A pure function of (n, config),
 *  so a resumed run samples exactly where the uninterrupted one did. */
export function sampleAt(n, { sample_every: every, steps }) {
  if (!every) return false;
  return n % every === 0 || n === steps || n === Math.min(every, Math.max(1, Math.floor(steps / 4)));
}

/** Whether the step with 1-based number `n` is followed by an eval: every `eval_every` steps and
 *  at the last step, so every finished run has an eval loss. eval_every 0: never. */
export function evalAt(n, { eval_every: every, steps }) {
  return Boolean(every) && (n % every === 0 || n === steps);
}
