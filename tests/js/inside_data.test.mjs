// The inside charts' data (static/js/app/inside_data.js) from the server's parameter table:
// resid_rms's labels follow the norm gains in table order (each layer's input and after-
// attention norm, then the final one), the update ratio's small multiples cover every tensor
// once, and the columns take only the eval rows.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fieldColumns, insideLayout, insideRows, shares } from '../../static/js/app/inside_data.js';
import { RunSeries } from '../../static/js/app/series.js';
import { serverLayout } from './server.mjs';

const params = serverLayout({ preset: 'tiny', n_layer: 2 }).params;

test('labels and groups from the parameter table', () => {
  const { norms, layers, groups } = insideLayout(params);
  assert.deepEqual(norms, ['layer 0 input', 'layer 0 after attention', 'layer 1 input',
    'layer 1 after attention', 'final norm input']);
  assert.deepEqual(layers, ['layer 0', 'layer 1']);
  assert.deepEqual(groups.map((g) => g.layer), ['embed', 'layer 0', 'layer 1', 'final norm']);
  assert.deepEqual(groups.flatMap((g) => g.members).sort((a, b) => a - b), params.map((_, i) => i));
  assert.deepEqual(groups[1].labels, ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj',
    'down_proj', 'input_layernorm', 'post_attention_layernorm']);
});

test('columns from the eval rows only, in table order', () => {
  const series = new RunSeries(['loss']);
  const inside = (k) => ({ resid_rms: [1, 2, 3, 4, k], mlp_dead: [0, 0.5], mlp_hist: [[1], [2]],
    update_ratio: params.map((_, i) => i / 1000 + k) });
  for (const rec of [{ step: 1, loss: 3 }, { step: 2, loss: 2, ...inside(5) }, { step: 3, loss: 1 },
    { step: 4, loss: 1, ...inside(6), resid_rms: [1, 2, 3, 4, null] }]) series.add(rec);
  const rows = insideRows().update(series, 0).rows;
  assert.deepEqual(rows, [1, 3]);
  const xs = series.steps;
  assert.deepEqual(fieldColumns(series, rows, xs, 'resid_rms', [0, 4]), [[2, 4], [1, 1], [5, null]]);
  const g = insideLayout(params).groups[3];   // the final norm: the table's last tensor
  assert.deepEqual(fieldColumns(series, rows, xs, 'update_ratio', g.members),
    [[2, 4], [(params.length - 1) / 1000 + 5, (params.length - 1) / 1000 + 6]]);
  assert.deepEqual(shares([1, 3, 0]), [0.25, 0.75, 0]);
  assert.deepEqual(shares([0, 0]), [0, 0]);
});
