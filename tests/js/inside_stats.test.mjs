// The model's inside from read-back buffers (engine/inside_stats.js) against NumPy on the same
// values: the residual RMS from RMSNorm's 1/rms, the MLP histogram's bins (the server's
// MLP_HIST_EDGES, exact edges and non-finite values included) and the dead-unit share.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  DEAD_SHARE, HIST_BINS, HIST_EDGES, histBin, mlpRows, mlpStats, residualRms,
} from '../../static/js/engine/inside_stats.js';
import { serverJson } from './server.mjs';

const REF = serverJson(`
import json, numpy as np
from andrea.metrics import MLP_HIST_EDGES, MLP_HIST_BINS
rng = np.random.default_rng(3)
R, F, C, eps = 37, 24, 16, 1e-5
h = (rng.standard_normal((R, F)) * np.exp(rng.uniform(-8, 2, (R, F)))).astype(np.float32)
h[:, 3] *= 1e-5                       # units far below the layer's RMS: dead
h[:, 7] = 0
h[0, :8] = [3, -3, 0.001, -0.001, 1, -1, 0, -0.0]   # on the edges
h[1, 9] = np.nan                      # counted in no bin, left out of the RMS and the peaks
hist_of = lambda x: np.bincount(np.where(np.signbit(x) & (x != 0), len(MLP_HIST_EDGES) - np.searchsorted(MLP_HIST_EDGES, np.abs(x), side="right"), len(MLP_HIST_EDGES) + 1 + np.searchsorted(MLP_HIST_EDGES, np.abs(x), side="right")), minlength=MLP_HIST_BINS)
ok = h[np.isfinite(h)].astype(np.float64)
rms = np.sqrt(np.mean(ok ** 2) * ok.size / (R * F))    # over R x F, as the engine divides
peak = np.nanmax(np.abs(h.astype(np.float64)), axis=0)
x = (rng.standard_normal((50, C)) * 3).astype(np.float32)
rstd = (1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + eps)).astype(np.float32)
print(json.dumps({"edges": list(MLP_HIST_EDGES), "bins": MLP_HIST_BINS, "R": R, "F": F,
    "h": [None if not np.isfinite(v) else float(v) for v in h.ravel()],
    "hist": hist_of(ok).tolist(), "dead": float(np.mean(peak < 0.01 * rms)),
    "rstd": rstd.tolist(), "eps": eps, "rms": float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))}))
`);

test('the histogram edges and bins are the server’s', () => {
  assert.deepEqual(HIST_EDGES, REF.edges);
  assert.equal(HIST_BINS, REF.bins);
  assert.equal(DEAD_SHARE, 0.01);
});

test('an MLP’s histogram and dead units equal NumPy’s', () => {
  const h = Float32Array.from(REF.h, (v) => (v === null ? NaN : v));
  const got = mlpStats(h, REF.R, REF.F);
  assert.deepEqual(got.hist, REF.hist);
  assert.equal(got.hist.reduce((a, b) => a + b), REF.R * REF.F - 1);   // the NaN in none
  assert.equal(got.dead, REF.dead);
  assert.ok(got.dead >= 2 / REF.F, 'the zero and the tiny unit are dead');
});

test('bins at the edges: |h| = edge opens the next bin, -0 and 0 share one', () => {
  assert.deepEqual([3, -3, 1, -1, 0.001, -0.001, 0, -0, 1e-9, -1e-9].map(histBin),
    [15, 0, 14, 1, 9, 6, 8, 8, 8, 7]);
});

test('the residual RMS from RMSNorm’s 1/rms per row', () => {
  const got = residualRms(Float32Array.from(REF.rstd), REF.eps);
  assert.ok(Math.abs(got - REF.rms) / REF.rms < 1e-6, `${got} vs ${REF.rms}`);
  assert.equal(residualRms(Float32Array.from([NaN]), REF.eps), null);
});

test('the MLP sample: every position while it fits, then as many as fit', () => {
  assert.equal(mlpRows(1344, 384), 682);
  assert.equal(mlpRows(100, 384), 100);
  assert.equal(mlpRows(8192, 1 << 20), 1);
});
