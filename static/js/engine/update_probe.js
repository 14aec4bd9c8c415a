// The update probe: each parameter tensor's update-to-weight ratio ||w_after - w_before|| /
// ||w_before|| for one chosen step, on the GPU, summed by the optimizer's own per-tensor
// reduction (Optimizer.tensorSumOps: 12_optimizer.wgsl reduce_norm_sq + finalize_tensor_stats).
//
//   const probe = await UpdateProbe.create(ctx, opt);   // one f32 copy of W, made once
//   the chosen step's encoder:  probe.snapshot(enc)     // before the optimizer's pass
//   any later encoder:          probe.encode(enc)       // sums, then the delta, then its sums
//                               probe.copyTo(enc, buf, offset)   // probe.bytes of results
//   once mapped:                probe.read(range, offset) -> [ratio per tensor | null]
//
// The copy of W costs as much memory as W; the trainer makes a probe only where it records the
// model's inside (trainer.js: every eval step).

import { align } from './gpu.js';
import { elementGrid } from './optimizer_plans.js';
import { encodeDispatch, launch, view } from './ops.js';
import { FILE } from './optimizer.js';

const WG = 256;

export class UpdateProbe {
  static async create(ctx, opt) {
    const probe = new UpdateProbe(ctx, opt);
    await probe.build();
    return probe;
  }

  constructor(ctx, opt) {
    this.device = ctx.device;
    this.lib = ctx.lib;
    this.opt = opt;
    this.T = opt.tensors;
    this.statsBytes = 16 + 16 * this.T;   // finalize_tensor_stats: [4 + 4t] = tensor t's sum
    this.bytes = 2 * this.statsBytes;     // the weights' sums, then the update's
    this.owned = [];
  }

  buffer(size, label) {
    const b = this.device.createBuffer({ label: `probe.${label}`, size: align(size, 16),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
    this.owned.push(b);
    return b;
  }

  async build() {
    const { opt } = this;
    this.before = this.buffer(opt.n * 4, 'before');       // W before the step, then the update
    const partials = this.buffer(Math.max(opt.segPlan.count, 1) * 8, 'partials');
    this.sums = [this.buffer(this.statsBytes, 'weight sums'), this.buffer(this.statsBytes, 'update sums')];
    const delta = await this.lib.pipeline(FILE, 'weight_delta', { WG }, ['cu', 'w4', 'g4']);
    const words = (what) => [`probe ${what} sums`, `probe ${what} tensor sums`];
    this.ops = [
      ...opt.tensorSumOps(this.before, partials, this.sums[0], words('weight')),
      ...opt.windows.map((win) => launch(this.device, delta, {
        cu: opt.chunk({ base: win.base, n4: win.len / 4 }), w4: view(opt.W, win.base, win.len),
        g4: view(this.before, win.base, win.len) }, elementGrid(win.len, WG), 'probe delta')),
      ...opt.tensorSumOps(this.before, partials, this.sums[1], words('update')),
    ];
  }

  /** W as it is before the step: encode before the optimizer's pass. */
  snapshot(enc) {
    enc.copyBufferToBuffer(this.opt.W, 0, this.before, 0, this.opt.n * 4);
  }

  /** After the step: the weights' sums of squares per tensor (as they were), the update, its. */
  encode(enc) {
    const pass = enc.beginComputePass({ label: 'update probe' });
    for (const op of this.ops) encodeDispatch(pass, op);
    pass.end();
  }

  copyTo(enc, buf, offset) {
    enc.copyBufferToBuffer(this.sums[0], 0, buf, offset, this.statsBytes);
    enc.copyBufferToBuffer(this.sums[1], 0, buf, offset + this.statsBytes, this.statsBytes);
  }

  /** Per tensor ||update|| / ||weights before||, 7 significant digits; null where the weights'
   *  norm is 0 or either sum is not finite. */
  read(range, offset) {
    const w = new Float32Array(range, offset, this.statsBytes / 4);
    const u = new Float32Array(range, offset + this.statsBytes, this.statsBytes / 4);
    return Array.from({ length: this.T }, (_, t) => {
      const r = Math.sqrt(u[4 + 4 * t]) / Math.sqrt(w[4 + 4 * t]);
      return Number.isFinite(r) ? Number(r.toPrecision(7)) : null;
    });
  }

  destroy() {
    for (const b of this.owned) b.destroy();
  }
}
