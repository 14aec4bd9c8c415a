// The optimizer's hyperparameters: what they are, the clip modes, and the 64-byte `Hyper`
// uniform of 12_optimizer.wgsl for one step.

export const CLIP_MODES = { off: 0, global: 1, per_tensor: 2 };   // 12_optimizer.wgsl CLIP_*

// What `hyper` holds. The engine keeps no defaults of its own: they are RunConfig's
// (server/run_config.py); the trainer passes its run's, pages the server's (page facts).
export const HYPER_KEYS = ['beta1', 'beta2', 'eps', 'weight_decay', 'max_norm', 'clip_mode'];

/** `hyper` updated with the defined values of `h`; the older {clip: false} means clip_mode off. */
export function mergeHyper(hyper, { clip, ...h }) {
  for (const [k, v] of Object.entries(h)) if (v !== undefined) hyper[k] = v;
  if (clip === false && h.clip_mode === undefined) hyper.clip_mode = 'off';
  const missing = HYPER_KEYS.filter((k) => hyper[k] === undefined);
  if (missing.length) {
    throw new Error(`optimizer: no ${missing.join(', ')} given (a run config's, or the server's defaults)`);
  }
  if (!(hyper.clip_mode in CLIP_MODES)) {
    throw new Error(`unknown clip_mode ${hyper.clip_mode} (${Object.keys(CLIP_MODES).join(', ')})`);
  }
  return hyper;
}

/**
 * The Hyper uniform of step `step` (1-based) with learning rate `lr`, written into `data` (an
 * ArrayBuffer of 64 bytes). Bias corrections 1 - beta^t are computed here in f64 and rounded to
 * f32 once, as torch does with its Python floats.
 */
export function hyperUniform(hyper, decayNumel, step, lr, data) {
  const { beta1, beta2, eps, weight_decay: wd, max_norm: maxNorm, clip_mode: mode } = hyper;
  const bc1 = 1 - beta1 ** step;
  const bc2 = 1 - beta2 ** step;
  const f = new Float32Array(data);
  const u = new Uint32Array(data);
  f[0] = beta1; f[1] = beta2; f[2] = 1 - beta1; f[3] = 1 - beta2;
  f[4] = eps; f[5] = 1 - lr * wd; f[6] = -(lr / bc1); f[7] = Math.sqrt(bc2);
  f[8] = maxNorm; u[9] = maxNorm > 0 ? CLIP_MODES[mode] : 0; u[10] = decayNumel; f[11] = lr;
  f[12] = -lr * Math.sqrt(bc2) / bc1; f[13] = eps * Math.sqrt(bc2); f[14] = 0; f[15] = 0;
  return data;
}
