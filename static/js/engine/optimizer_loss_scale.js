// Mixed precision's dynamic loss scaling, the optimizer's part (12_optimizer.wgsl: unscale_grads,
// bias_correct, zero_skipped_grads, update_loss_scale): what each entry point binds, the scaler's
// first value and what a stats copy says of it. optimizer.js builds and encodes the dispatches
// (its ops()). The scaler (scale, clean steps, applied steps) is part of a mixed run's checkpoint:
// Adam's bias corrections count the applied steps, as torch's AdamW under GradScaler does.

export const LOSS_SCALE_BINDINGS = {
  unscale_grads: ['cu', 'g4', 'scaler'],
  bias_correct: ['hp', 'stats', 'scaler'],
  zero_skipped_grads: ['cu', 'stats', 'g4'],
  update_loss_scale: ['stats', 'scaler'],
};

/** The scaler buffer's first value: f32 (loss scale, clean steps, applied steps, 0). */
export const scalerInit = ({ init }) => new Float32Array([init, 0, 0, 0]);

/** {loss_scale, skipped} from a stats copy's floats `f` (its tail after the T tensors'). */
export function lossScaleStats(f, T) {
  const tail = 4 + 4 * T;
  return { loss_scale: f[tail], skipped: f[tail + 1] > 0 };
}

/** Bytes of the stats tail with loss scaling (12_optimizer.wgsl: the scale used, skipped, the
 *  step's bias-corrected constants). */
export const LOSS_SCALE_STATS_BYTES = 32;
