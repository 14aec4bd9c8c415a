// Mixed precision's dynamic loss scaling, the optimizer's part (12_optimizer.wgsl: unscale_grads,
// zero_skipped_grads, update_loss_scale): the scaler buffer, its pipelines and per-window bind
// groups, built once by Optimizer._build when it has a lossScale. optimizer.js encodes them.

import { checked } from './gpu.js';
import { FILE, MAX_GRID } from './optimizer.js';

const BINDINGS = {
  unscale_grads: ['cu', 'g4', 'scaler'],
  zero_skipped_grads: ['cu', 'stats', 'g4'],
  update_loss_scale: ['stats', 'scaler'],
};

/** opt.scaler = (init, 0, 0, 0), opt.pUnscale / pZero / pGrow, each window's unscaleGroup and
 *  zeroGroup over its G range with gridE (one vec4 per thread), and opt.growGroup. */
export async function buildLossScale(opt, wg) {
  const { init, growth } = opt.lossScale;
  opt.scaler = opt._buffer(16, 'scaler', new Float32Array([init, 0, 0, 0]));
  [opt.pUnscale, opt.pZero, opt.pGrow] = await Promise.all([
    opt.lib.pipeline(FILE, 'unscale_grads', { WG: wg }, BINDINGS.unscale_grads),
    opt.lib.pipeline(FILE, 'zero_skipped_grads', { WG: wg }, BINDINGS.zero_skipped_grads),
    opt.lib.pipeline(FILE, 'update_loss_scale', { GROWTH: growth }, BINDINGS.update_loss_scale),
  ]);
  await checked(opt.device, `optimizer ${opt.variant} loss scale`, () => {
    for (const win of opt.windows) {
      const n4 = win.len / 4;
      const groups = Math.ceil(n4 / wg);
      const x = Math.min(groups, MAX_GRID);
      win.gridE = [x, Math.ceil(groups / x)];
      const cu = opt._chunk({ base: win.base, n4 });
      const g4 = opt._range(opt.G, win.base, win.len, 4);
      win.unscaleGroup = opt._group(opt.pUnscale, { cu, g4, scaler: opt.scaler });
      win.zeroGroup = opt._group(opt.pZero, { cu, g4, stats: opt.stats });
    }
    opt.growGroup = opt._group(opt.pGrow, { stats: opt.stats, scaler: opt.scaler });
  });
}

/** After the update: G zeroed where the step was skipped, then the scale updated. */
export function encodeScaleUpdate(opt, pass) {
  opt._perWindow(pass, opt.pZero, 'zeroGroup', 'gridE');
  pass.setPipeline(opt.pGrow.pipeline);
  pass.setBindGroup(0, opt.growGroup);
  pass.dispatchWorkgroups(1);
}

/** {loss_scale, skipped} from a stats copy's floats `f` (its tail after the T tensors'). */
export function lossScaleStats(opt, f) {
  const tail = 4 + 4 * opt.tensors;
  return { loss_scale: f[tail], skipped: f[tail + 1] > 0 };
}
