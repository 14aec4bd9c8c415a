// The model's inside at an eval step, from buffers the eval's forward already wrote (DOM-free;
// tests/js/inside_stats.test.mjs): the residual stream's RMS where each RMSNorm reads it, and
// each MLP's activation histogram and dead-unit fraction. The trainer reads the buffers back
// (trainer.js encodeEvalBatch); server/metrics.py's Record says what the fields hold.

// |h| bin edges of the MLP histogram: bins [e_k, e_k+1) of |h| per sign, 8 a side, the
// negative side first (bin 0: h <= -3 ... bin 7: -0.001 < h < 0; bin 8: 0 <= h < 0.001 ... bin
// 15: h >= 3). server/metrics.py names them for the CSV (MLP_HIST_EDGES).
export const HIST_EDGES = [0.001, 0.01, 0.03, 0.1, 0.3, 1, 3];
export const HIST_BINS = 2 * (HIST_EDGES.length + 1);
// A unit is dead on a batch when its largest |h| over the batch's positions is below this share
// of the layer's RMS activation: it adds (almost) nothing to any position's output.
export const DEAD_SHARE = 0.01;
// The MLP activations read back per layer: the first positions of the eval batch, at most this
// many values (the rest of the batch is not read: a 120m layer's is 64 MiB).
export const MLP_SAMPLE = 1 << 18;

/** Positions of the eval batch the MLP statistics use: all N, or as many as MLP_SAMPLE holds. */
export const mlpRows = (N, F) => Math.max(1, Math.min(N, Math.floor(MLP_SAMPLE / F)));

/** The RMS of the [N, C] rows an RMSNorm read, from its 1/rms per row (rstd = 1 / sqrt(mean x^2
 *  + eps)): sqrt(mean over rows of mean x^2); null where not finite. */
export function residualRms(rstd, eps) {
  let sum = 0;
  for (let i = 0; i < rstd.length; i++) sum += 1 / (rstd[i] * rstd[i]) - eps;
  const rms = Math.sqrt(Math.max(sum / rstd.length, 0));
  return Number.isFinite(rms) ? Number(rms.toPrecision(7)) : null;
}

/** The histogram bin of one activation (HIST_EDGES). */
export function histBin(x) {
  const a = Math.abs(x);
  let k = 0;
  while (k < HIST_EDGES.length && a >= HIST_EDGES[k]) k++;
  return x < 0 ? HIST_EDGES.length - k : HIST_EDGES.length + 1 + k;
}

/** One MLP's statistics from its activations h [R, F] (silu(gate) * up, R positions):
 *  {hist: counts per bin (non-finite values in none), dead: the share of the F units whose
 *  largest |h| is below DEAD_SHARE of the RMS of all R x F}. */
export function mlpStats(h, R, F) {
  const hist = new Array(HIST_BINS).fill(0);
  const peak = new Float64Array(F);
  let sq = 0;
  for (let r = 0; r < R; r++) {
    for (let j = 0; j < F; j++) {
      const x = h[r * F + j];
      if (!Number.isFinite(x)) continue;
      hist[histBin(x)]++;
      sq += x * x;
      const a = Math.abs(x);
      if (a > peak[j]) peak[j] = a;
    }
  }
  const floor = DEAD_SHARE * Math.sqrt(sq / (R * F));
  let dead = 0;
  for (let j = 0; j < F; j++) if (peak[j] < floor) dead++;
  return { hist, dead: dead / F };
}
