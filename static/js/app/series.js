// Run metrics as columns by step, for the run page's charts. A record appends in O(1); one that
// arrives out of order (or again: backlog and live overlap) costs one sorted insert. Derived
// columns extend over the new rows only, so a run of n steps costs O(n) in all, not O(n^2).
// No DOM: tests/js/series.test.mjs runs it under Node.

/** First index i with xs[i] >= x (xs sorted ascending). */
export function lowerBound(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

export class RunSeries {
  /** keys: the record fields kept as columns (missing fields are null). */
  constructor(keys) {
    this.keys = keys;
    this.steps = [];                  // sorted, unique
    this.records = [];                // [row] the record of steps[row]
    this.cols = Object.fromEntries(keys.map((k) => [k, []]));
    this.changedFrom = 0;             // first row changed since the last takeChanged()
  }

  get length() { return this.steps.length; }
  get last() { return this.records[this.records.length - 1] ?? null; }

  /** Adds (or replaces) the record of step rec.step. */
  add(rec) {
    const n = this.steps.length;
    let i = n;
    if (n && rec.step <= this.steps[n - 1]) i = lowerBound(this.steps, rec.step);
    if (this.steps[i] === rec.step) {            // seen before: replace the row
      this.records[i] = rec;
      for (const k of this.keys) this.cols[k][i] = rec[k] ?? null;
    } else if (i === n) {                        // in order: append
      this.steps.push(rec.step);
      this.records.push(rec);
      for (const k of this.keys) this.cols[k].push(rec[k] ?? null);
    } else {                                     // out of order: insert
      this.steps.splice(i, 0, rec.step);
      this.records.splice(i, 0, rec);
      for (const k of this.keys) this.cols[k].splice(i, 0, rec[k] ?? null);
    }
    this.changedFrom = Math.min(this.changedFrom, i);
  }

  /** Drops every row after step `step` (a run resumed from its checkpoint at that step: those
   *  steps are computed again). */
  truncateAfter(step) {
    const i = lowerBound(this.steps, step + 1);
    if (i === this.steps.length) return;
    this.steps.length = i;
    this.records.length = i;
    for (const k of this.keys) this.cols[k].length = i;
    this.changedFrom = Math.min(this.changedFrom, i);
  }

  /** The first row added or changed since the last call (length when none). */
  takeChanged() {
    const from = this.changedFrom;
    this.changedFrom = this.steps.length;
    return from;
  }
}

/**
 * State computed row by row, in step order, from a RunSeries: update(series, from) extends it
 * over the rows it has not seen, and rebuilds it from row 0 when a row it had seen changed
 * (an out-of-order record; rare). init() -> state; step(state, series, row).
 */
export class Derived {
  constructor(init, step) {
    this.init = init;
    this.step = step;
    this.reset();
  }

  reset() {
    this.state = this.init();
    this.done = 0;
  }

  update(series, from) {
    if (from < this.done) this.reset();
    for (let i = this.done; i < series.length; i++) this.step(this.state, series, i);
    this.done = series.length;
    return this.state;
  }
}

/** Exponential moving average with bias correction (TensorBoard-style), one value at a time:
 *  ema(alpha) -> next(y), the smoothed value so far; a null or non-finite y is a gap (null),
 *  alpha 0 gives y as it is. The pages' one EMA: smooth() over a column, runningSmooth() over
 *  the rows of a series. */
export function ema(alpha) {
  let m = 0;
  let n = 0;
  return (y) => {
    if (!alpha) return y;
    if (y === null || !Number.isFinite(y)) return null;
    m = alpha * m + (1 - alpha) * y;
    n += 1;
    return m / (1 - alpha ** n);
  };
}

/** A whole column smoothed by ema(), gaps kept (alpha 0: the column itself). */
export function smooth(ys, alpha) {
  if (!alpha) return ys;
  const next = ema(alpha);
  return ys.map((y) => next(y));
}

/** Running ema() of column `key`, or of `key(series, row)` (a column kept elsewhere, such as a
 *  source's losses), one row at a time. */
export function runningSmooth(key, alpha) {
  const at = typeof key === 'function' ? key : (series, i) => series.cols[key][i];
  return new Derived(() => ({ out: [], next: ema(alpha) }), (s, series, i) => {
    s.out.push(s.next(at(series, i) ?? null));
  });
}

/** The row of `step` in the series (-1: none). */
export function rowOf(series, step) {
  const i = lowerBound(series.steps, step);
  return series.steps[i] === step ? i : -1;
}

/** The last eval loss and the best so far ({last, best}, null before the first eval), and a
 *  task run's last and best exact-match accuracy ({acc, bestAcc}). */
export function evalLosses() {
  return new Derived(() => ({ best: null, last: null, acc: null, bestAcc: null }), (s, series, i) => {
    const a = series.cols.eval_acc?.[i];
    if (a !== null && a !== undefined && Number.isFinite(a)) {
      s.acc = a;
      if (s.bestAcc === null || a > s.bestAcc) s.bestAcc = a;
    }
    const v = series.cols.eval_loss[i];
    if (v === null || !Number.isFinite(v)) return;
    s.last = v;
    if (s.best === null || v < s.best) s.best = v;
  });
}

/** Mixed precision's skipped steps (a non-finite gradient under the loss scale): how many, and
 *  the steps. */
export function skippedSteps() {
  return new Derived(() => ({ steps: [], count: 0 }), (s, series, i) => {
    if (!series.records[i].skipped) return;
    s.steps.push(series.steps[i]);
    s.count += 1;
  });
}

/** Steps where the bandit phase changes (the chart marks). */
export function phaseMarks() {
  return new Derived(() => ({ marks: [], prev: null }), (s, series, i) => {
    const ph = series.records[i].phase;
    if (ph === undefined || ph === null) return;
    if (s.prev !== null && ph !== s.prev) s.marks.push(series.steps[i]);
    s.prev = ph;
  });
}

/** Clip events: the grad norm where clip_scale < 1 (else null), and how many there were. */
export function clipEvents() {
  return new Derived(() => ({ norm: [], count: 0 }), (s, series, i) => {
    const c = series.cols.clip_scale[i];
    const clipped = c !== null && c < 1;
    s.norm.push(clipped ? series.cols.grad_norm[i] : null);
    if (clipped) s.count += 1;
  });
}

/** Per-source columns of the records' `source_losses` ({source index: loss}, the bandit's):
 *  cols[index] has one value (or null) per row; a source first seen late is back-filled. */
export function sourceColumns() {
  return new Derived(() => ({ cols: {}, rows: 0 }), (s, series, i) => {
    const losses = series.records[i].source_losses || {};
    for (const key of Object.keys(losses)) {
      if (!(key in s.cols)) s.cols[key] = new Array(s.rows).fill(null);
    }
    for (const [key, col] of Object.entries(s.cols)) col.push(losses[key] ?? null);
    s.rows += 1;
  });
}

/** Elapsed wall-clock seconds per row, from the rows' commit `time` (the first row's is 0). */
export function elapsedColumn() {
  return new Derived(() => ({ out: [], t0: null }), (s, series, i) => {
    const t = series.records[i].time;
    if (s.t0 === null && t !== undefined && t !== null) s.t0 = t;
    const prev = s.out.length ? s.out[s.out.length - 1] : 0;
    // A row without a time (never the case once committed) keeps the x axis increasing.
    s.out.push(t === undefined || t === null || s.t0 === null ? prev : Math.max(prev, t - s.t0));
  });
}

/** The median of numbers (null for none). */
export function median(xs) {
  if (!xs.length) return null;
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

const ETA_ROWS = 50;        // the fewest rows the time per step is measured over (once there)
const ETA_MAX_ROWS = 5000;  // ... and the most: a schedule whose period is longer is cut

const gcd = (a, b) => (b ? gcd(b, a % b) : a);

/** The rows progress() measures the time per step over, for a run's config: a whole number of
 *  periods of its schedule (evals every eval_every steps, samples every sample_every; 0: none),
 *  at least ETA_ROWS, so that every window holds as many evals and samples as any other and the
 *  estimate does not jump as one enters or leaves it. A period past ETA_MAX_ROWS (eval_every 37
 *  with sample_every 100: 3700 is fine; co-prime thousands are not) is cut to that many rows. */
export function etaWindow(config) {
  let period = 1;
  for (const every of [config?.eval_every, config?.sample_every]) {
    if (every > 0) period = (period / gcd(period, every)) * every;
  }
  return Math.min(ETA_MAX_ROWS, period * Math.ceil(ETA_ROWS / period));
}

/** Progress from the newest rows: seconds per step, elapsed seconds, and the seconds left for
 *  `total` steps. Seconds per step: the mean of the last `window` rows' step_ms (each step's
 *  wall time from the previous step's record to its own: the evals, samples and checkpoint
 *  copies between them included, a pause not: trainer.js), i.e. the measured wall time over
 *  those steps. A typical step's time (a median) would leave those out and say too little time
 *  left: 200 steps of 100 ms with an eval and a sample costing 3 s every 50 take 32 s, not 20.
 *  `window`: etaWindow(config), a whole number of the schedule's periods. The first row of the
 *  series (the trainer's start-up) is left out while others are there. Rows without step_ms
 *  (an older trainer's): the commit times over the same rows. */
export function progress(series, total, window = ETA_ROWS) {
  const n = series.length;
  if (!n) return null;
  const last = series.records[n - 1];
  const first = series.records[0];
  let sum = 0;
  let count = 0;
  for (let i = Math.max(n > 1 ? 1 : 0, n - window); i < n; i++) {
    const ms = series.records[i].step_ms;
    if (ms > 0) { sum += ms; count++; }
  }
  let perStep = count ? sum / count / 1000 : null;
  const ref = series.records[Math.max(0, n - 1 - window)];
  if (perStep === null && n > 1 && last.time != null && ref.time != null && last.step > ref.step) {
    perStep = (last.time - ref.time) / (last.step - ref.step);
  }
  if (perStep !== null && perStep <= 0) perStep = null;
  const elapsed = last.time != null && first.time != null
    ? last.time - first.time + (first.step_ms ?? 0) / 1000 : null;
  const left = Math.max(0, total - last.step);
  return { step: last.step, fraction: total ? Math.min(1, last.step / total) : 0, perStep,
    elapsed, eta: perStep === null ? null : left * perStep };
}

/** The points of a line that no segment would show (charts.js draws a marker on each): on a
 *  line that spans gaps, the one value when there is exactly one (a run with a single eval,
 *  the first step); without spanning, each value between two gaps. -> indices, or null. Stops
 *  at the second value on a spanned line: O(1) for a dense column. */
export function isolatedPoints(ys, spanGaps = true) {
  const has = (i) => i >= 0 && i < ys.length && ys[i] !== null && ys[i] !== undefined
    && Number.isFinite(ys[i]);
  if (spanGaps) {
    let only = null;
    for (let i = 0; i < ys.length; i++) {
      if (!has(i)) continue;
      if (only !== null) return null;
      only = i;
    }
    return only === null ? null : [only];
  }
  const out = [];
  for (let i = 0; i < ys.length; i++) if (has(i) && !has(i - 1) && !has(i + 1)) out.push(i);
  return out.length ? out : null;
}
