// The inside charts' data, without the DOM (tests/js/inside_data.test.mjs runs it under Node):
// which rows of a RunSeries carry an eval step's inside (resid_rms, mlp_dead, mlp_hist,
// update_ratio: server/metrics.py), the run's parameter table made into the charts' labels and
// groups, and the columns each chart draws.
import { Derived } from './series.js';

const hasInside = (rec) => Array.isArray(rec?.resid_rms);

/** The series rows whose record has the inside (the eval steps), in order. */
export const insideRows = () => new Derived(() => ({ rows: [] }), (s, series, i) => {
  if (hasInside(series.records[i])) s.rows.push(i);
});

/** A norm gain's name as where it reads the residual stream. */
export function normLabel(name) {
  const m = /layers\.(\d+)\.(input|post_attention)_layernorm/.exec(name);
  if (m) return `layer ${m[1]} ${m[2] === 'input' ? 'input' : 'after attention'}`;
  return 'final norm input';
}

/** A tensor's name inside its layer ("model.layers.1.mlp.down_proj.weight" -> "down_proj"). */
export const tensorLabel = (name) => name.replace(/\.weight$/, '').split('.').pop();

/**
 * The charts' facts from the run's parameter table `params` (name, shape, layer; in table
 * order, which every per-tensor list follows): norms, the labels of resid_rms's entries (the
 * 1-D tensors, in order); layers, the model's layers by name; groups, per table layer ("embed",
 * "layer i", "final norm") its tensors' indices and labels (the update ratio's small multiples).
 */
export function insideLayout(params) {
  const norms = params.filter((p) => p.shape.length === 1).map((p) => normLabel(p.name));
  const groups = [...new Set(params.map((p) => p.layer))].map((layer) => {
    const members = params.flatMap((p, i) => (p.layer === layer ? [i] : []));
    return { layer, members, labels: members.map((i) => tensorLabel(params[i].name)) };
  });
  const layers = groups.map((g) => g.layer).filter((l) => l.startsWith('layer '));
  return { norms, layers, groups };
}

/** [x per inside row, then per index of `indices` the record's field[index] there (null where
 *  absent or not finite)]: a uPlot chart's columns. xs: the page's x per series row. */
export function fieldColumns(series, rows, xs, field, indices) {
  return [rows.map((i) => xs[i]), ...indices.map((j) => rows.map((i) => {
    const v = series.records[i][field]?.[j];
    return typeof v === 'number' && Number.isFinite(v) ? v : null;
  }))];
}

/** A histogram's counts as shares of their sum (all 0 for an empty one). */
export function shares(counts) {
  const total = counts.reduce((a, b) => a + b, 0);
  return counts.map((c) => (total ? c / total : 0));
}
