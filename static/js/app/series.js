// Run metrics as columns by step, for the run page's charts. A record appends in O(1); one that
// arrives out of order (or again: backlog and live overlap) costs one sorted insert. Derived
// columns extend over the new rows only, so a run of n steps costs O(n) in all, not O(n^2).
// No DOM: tests/js/series.test.mjs runs it under Node.

/** First index i with xs[i] >= x (xs sorted ascending). */
function lowerBound(xs, x) {
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

/** Running EMA with bias correction of column `key` (charts.js smooth(), one row at a time). */
export function runningSmooth(key, alpha) {
  return new Derived(() => ({ out: [], m: 0, n: 0 }), (s, series, i) => {
    const y = series.cols[key][i];
    if (!alpha) { s.out.push(y); return; }
    if (y === null || !Number.isFinite(y)) { s.out.push(null); return; }
    s.m = alpha * s.m + (1 - alpha) * y;
    s.n += 1;
    s.out.push(s.m / (1 - alpha ** s.n));
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
