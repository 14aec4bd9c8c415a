// What one training step reads back and the record it becomes. The trainer copies, per step,
// into one MAP_READ ring slot:
//   [0, 12)               losses[N .. N+3) (07_loss.wgsl): mean loss, max |logit|, min softmax
//                         denominator
//   [16, 16 + 8*STAMPS)   timestamps (u64 ns): the step's begin, the optimizer pass's begin and end
//   [SLOT_HEAD, +stats)   the optimizer's stats (optimizer.js: global, then per tensor)
//   then                  the per-token losses, f32 [B*T]
// and stepRecord() turns a mapped slot into the record server/metrics.py defines.

export const RING = 4;            // slots: how many steps the CPU may run ahead of the GPU
export const STAMPS = 3;          // timestamps per step
export const SLOT_HEAD = 64;
const STAMPS_AT = 16;

/** Byte offsets of a slot's parts for optimizer stats of `statsBytes` and N tokens. */
export function slotLayout(statsBytes, N) {
  const tokens = SLOT_HEAD + statsBytes;
  return { loss: 0, stamps: STAMPS_AT, stats: SLOT_HEAD, tokens, bytes: tokens + 4 * N };
}

const finite = (x) => (Number.isFinite(x) ? x : null);
const digits7 = (x) => (Number.isFinite(x) ? Number(x.toPrecision(7)) : null);

/**
 * The record of a step from its mapped slot `range` (ArrayBuffer): opt (the Optimizer: readStats),
 * B, T, batch (.sources per row, .phase), lr, ms (wall time since the previous step's record),
 * optMs (the optimizer pass's GPU ms or null), evalLoss, evalAcc (a task run's exact-match
 * accuracy on the held-out batch, or null), inside (an eval step's: resid_rms, mlp_dead,
 * mlp_hist, update_ratio; trainer.js readInside), or null.
 */
export function stepRecord(range, { opt, B, T, step, lr, batch, ms, optMs, evalLoss, evalAcc,
  inside = null }) {
  const N = B * T;
  const at = slotLayout(opt.statsBytes, N);
  const [loss, logitMax, denomMin] = new Float32Array(range, at.loss, 3);
  const s = opt.readStats(range, at.stats);
  const tok = new Float32Array(range, at.tokens, N);
  // Per-source mean training loss from the per-token losses, for the source bandit, and each
  // row's mean (7 significant digits, about f32's), whose outliers a spike points at.
  const sums = {};
  const rows = new Array(B);
  for (let b = 0; b < B; b++) {
    let sum = 0;
    for (let t = 0; t < T; t++) sum += tok[b * T + t];
    rows[b] = digits7(sum / T);
    const k = String(batch.sources[b]);
    sums[k] = sums[k] ?? [0, 0];
    sums[k][0] += sum;
    sums[k][1] += T;
  }
  const nonfinite = Math.round(s.nonfinite);
  const rec = {
    step: step + 1, loss: finite(loss), grad_norm: finite(s.grad_norm),
    clip_scale: finite(s.clip_scale), lr,
    tokens_per_s: (N * 1000) / ms, step_ms: ms, ...(optMs !== null ? { opt_ms: optMs } : {}),
    source_losses: Object.fromEntries(Object.entries(sums)
      .map(([k, [sum, n]]) => [k, sum / n]).filter(([, v]) => Number.isFinite(v))),
    row_losses: rows,
    // Each tensor's gradient norm before clipping, in parameter-table order: their squares sum
    // to grad_norm's (the GPU adds the same f32 sums).
    tensor_grad_norms: Array.from(s.tensor_sq, (sq) => digits7(Math.sqrt(sq))),
    grad_nonfinite: nonfinite,
    logit_max: finite(logitMax),
    softmax_denom_min: finite(denomMin),
  };
  if (nonfinite > 0) rec.tensor_nonfinite = Array.from(s.tensor_nonfinite, Math.round);
  // Mixed precision: the loss scale the step's gradients were computed under, and whether its
  // update was skipped (a non-finite gradient: the scale then halves, torch's GradScaler rule).
  if (s.loss_scale !== undefined) {
    rec.loss_scale = s.loss_scale;
    rec.skipped = s.skipped;
  }
  if (batch.phase !== null) rec.phase = batch.phase;
  if (evalLoss !== null && evalLoss !== undefined && Number.isFinite(evalLoss)) rec.eval_loss = evalLoss;
  if (evalAcc !== null && evalAcc !== undefined) rec.eval_acc = evalAcc;
  if (inside) Object.assign(rec, inside);
  return rec;
}
