// The gradient-norm heatmap's data (static/js/app/heatmap_data.js): rows from a run's parameter
// names, per-layer norms from per-tensor norms, binning that keeps a one-step spike at any zoom,
// the log colour scale.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  LEVELS, binColumns, bucketOf, columnAt, heatRows, layerValues, logPosition, paletteColor,
  rowColumns,
  rowNorm, topTensor,
} from '../../static/js/app/heatmap_data.js';
import { RunSeries } from '../../static/js/app/series.js';
import { rng } from '../../static/js/engine/sampler.js';   // seeded: the same norms every run
import { serverLayout } from './server.mjs';

/** The server's layout of a tiny model with `nLayer` layers: its parameter table (name, layer,
 *  ...) in server/model.py build_layout's order: the decayed matrices (embed, then each layer's
 *  projections), then the norm gains. */
const llamaParams = (nLayer) => serverLayout({ preset: 'tiny', n_layer: nLayer }).params;

test('rows: one per layer in model order, or one per tensor grouped by layer', () => {
  const params = llamaParams(2);
  const names = params.map((p) => p.name);
  const layers = heatRows(params, 'layer');
  assert.deepEqual(layers.labels, ['embed', 'layer 0', 'layer 1', 'final norm']);
  assert.deepEqual(layers.members.flat().sort((a, b) => a - b), names.map((_, i) => i));
  // Layer 1 holds its 7 matrices and its 2 norm gains, though the table lists the gains last.
  assert.deepEqual(layers.members[2].map((i) => names[i].split('.').slice(3).join('.')).sort(),
    ['input_layernorm.weight', 'mlp.down_proj.weight', 'mlp.gate_proj.weight', 'mlp.up_proj.weight',
      'post_attention_layernorm.weight', 'self_attn.k_proj.weight', 'self_attn.o_proj.weight',
      'self_attn.q_proj.weight', 'self_attn.v_proj.weight']);
  const tensors = heatRows(params, 'tensor');
  const layerOf = new Map(params.map((p) => [p.name, p.layer]));
  assert.equal(tensors.labels.length, names.length);
  assert.deepEqual(tensors.names.map((n) => layerOf.get(n)), tensors.names.map((n) => layerOf.get(n))
    .slice().sort((a, b) => layers.labels.indexOf(a) - layers.labels.indexOf(b)));
  assert.equal(tensors.labels[0], 'embed_tokens');
  assert.equal(tensors.labels.at(-1), 'norm');
  assert.deepEqual(new Set(tensors.names), new Set(names));
});

test('the layers\' norms add up (in squares) to the global norm of all tensors', () => {
  const params = llamaParams(3);
  const names = params.map((p) => p.name);
  const rand = rng(7);
  const norms = names.map(() => rand() * 3);
  const global = Math.sqrt(norms.reduce((a, v) => a + v * v, 0));
  const rows = heatRows(params, 'layer');
  const perLayer = rows.members.map((m) => rowNorm(norms, m));
  assert.ok(Math.abs(Math.hypot(...perLayer) - global) < 1e-12 * global);
  for (const [r, m] of rows.members.entries()) {   // each against a plain loop over the names
    const want = Math.sqrt(params.reduce((a, p, i) => a + (p.layer === rows.labels[r] ? norms[i] ** 2 : 0), 0));
    assert.ok(Math.abs(perLayer[r] - want) <= 1e-12 * want);
  }
  // One non-finite tensor makes its layer's norm non-finite, and only that layer's.
  norms[rows.members[1][0]] = null;
  assert.deepEqual(rows.members.map((m) => rowNorm(norms, m) === null), [false, true, false, false, false]);
});

test('row columns follow the series: records without per-tensor norms are gaps', () => {
  const params = llamaParams(2);
  const names = params.map((p) => p.name);
  const rows = heatRows(params, 'layer');
  const series = new RunSeries(['grad_norm']);
  const norms = (k) => names.map((_, i) => k + i / 100);
  series.add({ step: 1, tensor_grad_norms: norms(1) });
  series.add({ step: 2 });                                         // an older record
  series.add({ step: 3, tensor_grad_norms: norms(3).slice(1) });   // another layout's
  const cols = rowColumns(rows, names.length);
  const { cols: out } = cols.update(series, 0);
  assert.equal(out[0][0], 1);                                      // embed: tensor 0 alone
  assert.ok(Number.isNaN(out[0][1]) && Number.isNaN(out[0][2]));
  series.add({ step: 0, tensor_grad_norms: norms(0) });            // out of order: rebuilt
  const again = cols.update(series, series.takeChanged()).cols;
  assert.equal(again[0].length, 4);
  assert.equal(again[0][0], 0);
  assert.equal(again[3][1], rowNorm(norms(1), rows.members[3]));
});

test('binning keeps at most one column per pixel and each column\'s max, a one-step spike too', () => {
  const n = 100_000;
  const xs = Array.from({ length: n }, (_, i) => i + 1);
  const rand = rng(3);
  const cols = [xs.map(() => 1 + rand() * 0.2), xs.map(() => 0.01 + rand() * 0.001)];
  cols[1][54_321] = 40;                                            // step 54322
  cols[0][77_777] = null;                                          // not finite
  const bins = binColumns(xs, cols, 1, n, 800);
  assert.ok(bins.x0.length <= 800 + 1);
  // Contiguous columns that cover the whole range.
  assert.ok(bins.x0[0] <= 1 && bins.x1.at(-1) >= n);
  for (let c = 1; c < bins.x0.length; c++) assert.equal(bins.x0[c], bins.x1[c - 1]);
  for (let c = 0; c < bins.x0.length; c++) {                       // each against its points
    for (const r of [0, 1]) {
      const pts = cols[r].slice(bins.start[c], bins.end[c]);
      const want = pts.includes(null) ? null : Math.max(...pts);
      assert.equal(bins.vals[r][c], want);
    }
  }
  const c = columnAt(bins, 54_322);
  assert.equal(bins.vals[1][c], 40);
  assert.equal(xs[bins.at[1][c]], 54_322);
  assert.equal(bins.vals[0][columnAt(bins, 77_778)], null);
  assert.equal(bins.max, 40);
  // The legend's range is the shown cells' (each a column's max), not the raw points'.
  assert.equal(bins.min, Math.min(...bins.vals.flat().filter((v) => v !== null)));
  assert.ok(bins.min > Math.min(...cols[1]));
});

test('zoomed in: one column per step, centred on it, the steps just outside at the edges', () => {
  const xs = Array.from({ length: 1000 }, (_, i) => i + 1);
  const cols = [xs.map((x) => x)];
  const bins = binColumns(xs, cols, 100, 110, 800);
  assert.deepEqual(bins.vals[0], [99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]);
  assert.deepEqual([bins.x0[1], bins.x1[1]], [99.5, 100.5]);
  assert.equal(columnAt(bins, 104.2), 5);
  assert.equal(columnAt(bins, 500), -1);
  const first = binColumns(xs, cols, 1, 3, 800);                   // the first step: half a step before
  assert.deepEqual([first.x0[0], first.x1[0]], [0.5, 1.5]);
});

test('the log colour scale: min at 0, max at 1, the geometric mean half way', () => {
  assert.equal(logPosition(0.01, 0.01, 100), 0);
  assert.equal(logPosition(100, 0.01, 100), 1);
  assert.ok(Math.abs(logPosition(1, 0.01, 100) - 0.5) < 1e-12);
  assert.equal(logPosition(0, 0.01, 100), 0);                      // a zero norm: the lowest colour
  assert.equal(bucketOf(100, 0.01, 100), LEVELS - 1);
  assert.equal(bucketOf(0.01, 0.01, 100), 0);
  assert.equal(paletteColor(0), 'rgb(68, 1, 84)');
  assert.equal(paletteColor(1), 'rgb(253, 231, 37)');
});

test('a layer\'s top tensor and its share of the layer\'s squared norm', () => {
  const norms = [3, 4, null, 0];
  assert.deepEqual(topTensor(norms, [0, 1, 2, 3]), { index: 1, norm: 4, share: 16 / 25 });
  assert.equal(topTensor([null], [0]), null);
});

test('a layer\'s norm per record for the compare page: gaps where a record has none', () => {
  const params = llamaParams(2);
  const names = params.map((p) => p.name);
  const rand = rng(11);
  const recs = [1, 2, 3].map((step) => ({ step, tensor_grad_norms: names.map(() => rand()) }));
  recs.push({ step: 4 });
  const got = layerValues(recs, params, 'layer 1');
  const want = recs.slice(0, 3).map((r) => Math.sqrt(names.reduce((a, n, i) => a
    + (n.startsWith('model.layers.1.') ? r.tensor_grad_norms[i] ** 2 : 0), 0)));
  got.slice(0, 3).forEach((v, i) => assert.ok(Math.abs(v - want[i]) <= 1e-12 * want[i]));
  assert.equal(got[3], null);
  assert.deepEqual(layerValues(recs, params, 'layer 7'), [null, null, null, null]);
});

test('points at the same x (one commit on the wall-clock axis) share one column', () => {
  const xs = [0, 0, 0, 1.5, 1.5, 3];
  const bins = binColumns(xs, [[1, 7, 2, 3, 4, 5]], 0, 3, 800);
  assert.deepEqual(bins.start, [0, 3, 5]);
  assert.deepEqual(bins.vals[0], [7, 4, 5]);
  assert.deepEqual(bins.x0, [-0.75, 0.75, 2.25]);
});
