// The gradient-norm heatmap's data, without the DOM (tests/js/heatmap.test.mjs runs it under
// Node): the rows (one per layer, or one per parameter tensor) from the run's parameter table,
// each row's norm per record from the record's `tensor_grad_norms` (one per tensor, in
// parameter-table order), the records binned into at most one column per pixel, and the log
// colour scale.
import { Derived, lowerBound } from './series.js';

/** A tensor's name without the parts every name has ("layers.1.mlp.down_proj"). */
export const shortName = (name) => name.replace(/^model\./, '').replace(/\.weight$/, '');

/**
 * The heatmap's rows for the run's parameter tensors `params` (its layout's entries, in table
 * order: name and layer, server/model.py). mode 'layer': one row per layer, in model order (the
 * table meets them in it); 'tensor': one per tensor, grouped by layer (the table lists the norm
 * gains last) and in table order inside it. -> {mode, labels, names (a row's full name),
 * members: [[tensor index]]}.
 */
export function heatRows(params, mode = 'layer') {
  const layers = [...new Set(params.map((p) => p.layer))];
  const byLayer = layers.map((l) => params.flatMap((p, i) => (p.layer === l ? [i] : [])));
  if (mode === 'layer') return { mode, labels: layers, names: layers, members: byLayer };
  const members = byLayer.flat().map((i) => [i]);
  return { mode, labels: members.map(([i]) => shortName(params[i].name)),
    names: members.map(([i]) => params[i].name), members };
}

/** A row's norm from one record's tensor norms: the root of the sum of its tensors' squares;
 *  null when one of them is not finite (null), NaN when the record has no usable norms. */
export function rowNorm(norms, members) {
  let sq = 0;
  for (const i of members) {
    const v = norms[i];
    if (v === null) return null;
    if (typeof v !== 'number' || !Number.isFinite(v)) return NaN;
    sq += v * v;
  }
  return Math.sqrt(sq);
}

/** Whether a record carries per-tensor norms that fit a layout of `count` tensors. */
export const hasTensorNorms = (rec, count) => Array.isArray(rec?.tensor_grad_norms)
  && (count === undefined || rec.tensor_grad_norms.length === count);

/** Per row of a RunSeries (series.js), each heat row's norm: state.cols[row] has one value per
 *  series row (null: not finite; NaN: that record has no per-tensor norms, drawn as nothing). */
export function rowColumns(rows, count) {
  return new Derived(() => ({ cols: rows.members.map(() => []) }), (s, series, i) => {
    const rec = series.records[i];
    const ok = hasTensorNorms(rec, count);
    rows.members.forEach((m, r) => s.cols[r].push(ok ? rowNorm(rec.tensor_grad_norms, m) : NaN));
  });
}

/** First index i with xs[i] > x (xs ascending). */
function upperBound(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/** The spacing from the first (or last) point to the nearest point at another x (1: none). */
function endSpacing(xs, last) {
  const x = last ? xs[xs.length - 1] : xs[0];
  for (let k = 1; k < xs.length; k++) {
    const y = last ? xs[xs.length - 1 - k] : xs[k];
    if (y !== x) return Math.abs(x - y);
  }
  return 1;
}

/** Where a point's cell starts on x: halfway from the point before (the first point: half the
 *  spacing to the next x). */
function leftEdge(xs, i) {
  return i > 0 ? (xs[i - 1] + xs[i]) / 2 : xs[0] - endSpacing(xs, false) / 2;
}

function rightEdge(xs, i) {
  return i + 1 < xs.length ? (xs[i] + xs[i + 1]) / 2 : xs[i] + endSpacing(xs, true) / 2;
}

/**
 * The points of xs in [xmin, xmax] (and one on each side, so the cells reach the plot's edges),
 * in at most `maxCols` columns of consecutive points (points at the same x in one). A column holds each row's MAX over its
 * points (a spike is one step: an average over a wide column would hide it), and a non-finite
 * value (null) wins over any number. -> {x0, x1: each column's x extent, start, end: its points
 * [start, end), vals[r][c], at[r][c]: the point that gave the value (-1: none), min, max: the
 * smallest and largest finite value shown (min > 0 where one is; null when none)}.
 */
export function binColumns(xs, cols, xmin, xmax, maxCols) {
  const lo = Math.max(0, lowerBound(xs, xmin) - 1);
  const hi = Math.min(xs.length, upperBound(xs, xmax) + 1);
  const n = Math.max(0, hi - lo);
  const per = Math.max(1, Math.ceil(n / Math.max(1, maxCols)));
  const out = { x0: [], x1: [], start: [], end: [], vals: cols.map(() => []), at: cols.map(() => []),
    min: null, max: null };
  let positiveMin = null;
  let zeroSeen = false;
  for (let a = lo, b; a < hi; a = b) {
    // Points at one x (the records of one commit, on the wall-clock axis) share a column.
    for (b = Math.min(hi, a + per); b < hi && xs[b] === xs[b - 1];) b++;
    out.start.push(a);
    out.end.push(b);
    out.x0.push(leftEdge(xs, a));
    out.x1.push(rightEdge(xs, b - 1));
    cols.forEach((col, r) => {
      let v = NaN;
      let at = -1;
      for (let i = a; i < b; i++) {
        const y = col[i];
        if (y === null) { v = null; at = i; break; }       // not finite: the column's worst
        if (Number.isNaN(y) || y === undefined) continue;
        if (Number.isNaN(v) || y > v) { v = y; at = i; }
      }
      out.vals[r].push(v);
      out.at[r].push(at);
      if (v === null || Number.isNaN(v)) return;
      if (out.max === null || v > out.max) out.max = v;
      if (v > 0 && (positiveMin === null || v < positiveMin)) positiveMin = v;
      if (v <= 0) zeroSeen = true;
    });
  }
  out.min = positiveMin ?? (zeroSeen ? 0 : null);
  return out;
}

/** The column whose x extent holds x (-1: none). */
export function columnAt(bins, x) {
  const c = lowerBound(bins.x1, x);
  return c < bins.x0.length && bins.x0[c] <= x ? c : -1;
}

/** Where v lies from min to max on a log scale, 0..1 (v <= min: 0, a flat range: 1). */
export function logPosition(v, min, max) {
  if (!(v > 0) || !(min > 0) || v <= min) return 0;
  if (v >= max) return 1;
  return Math.log(v / min) / Math.log(max / min);
}

// A perceptually even sequential palette (viridis' stops): dark is small, yellow is large.
export const PALETTE = ['#440154', '#482878', '#3e4989', '#31688e', '#26828e', '#1f9e89',
  '#35b779', '#6ece58', '#b5de2b', '#fde725'];
export const NONFINITE_COLOR = '#ff00aa';   // far from every palette colour
export const LEVELS = 64;                    // colour buckets: one fill per bucket per draw

/** The palette's colour at t in 0..1 (linear between its stops), as "rgb(r, g, b)". */
export function paletteColor(t) {
  const x = Math.min(1, Math.max(0, t)) * (PALETTE.length - 1);
  const i = Math.min(PALETTE.length - 2, Math.floor(x));
  const rgb = (hex) => [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
  const [a, b] = [rgb(PALETTE[i]), rgb(PALETTE[i + 1])];
  const f = x - i;
  return `rgb(${a.map((c, k) => Math.round(c + (b[k] - c) * f)).join(', ')})`;
}

/** The colour bucket (0..LEVELS-1) of v on the log scale from min to max. */
export const bucketOf = (v, min, max) => Math.min(LEVELS - 1,
  Math.floor(logPosition(v, min, max) * LEVELS));

/** The tensor of `members` with the largest norm in one record's tensor norms, and its share of
 *  the members' summed squares: {index, norm, share} (null: none finite). */
export function topTensor(norms, members) {
  let best = null;
  let sq = 0;
  for (const i of members) {
    const v = norms[i];
    if (typeof v !== 'number' || !Number.isFinite(v)) continue;
    sq += v * v;
    if (best === null || v > norms[best]) best = i;
  }
  if (best === null) return null;
  return { index: best, norm: norms[best], share: sq > 0 ? norms[best] ** 2 / sq : 0 };
}

/** Per record, the norm of layer `layer` ("embed", "layer i", "final norm") from its
 *  tensor_grad_norms under the run's parameter table `params` (null: not finite, the layer is
 *  not in the layout, or the record has no per-tensor norms). */
export function layerValues(records, params, layer) {
  const members = heatRows(params, 'layer');
  const r = members.labels.indexOf(layer);
  return records.map((rec) => {
    if (r < 0 || !hasTensorNorms(rec, params.length)) return null;
    const v = rowNorm(rec.tensor_grad_norms, members.members[r]);
    return Number.isNaN(v) ? null : v;
  });
}
