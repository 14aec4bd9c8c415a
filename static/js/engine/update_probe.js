// The update probe: each parameter tensor's update-to-weight ratio ||w_after - w_before|| /
// ||w_before|| for one chosen step, on the GPU, with the optimizer's own per-tensor reduction
// (12_optimizer.wgsl reduce_norm_sq + finalize_tensor_stats over the same norm segments).
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
import { windowSegments } from './norm_segments.js';
import { elementGrid, grid2d } from './optimizer_plans.js';
import { encodeDispatch, launch } from './ops.js';

const FILE = '12_optimizer.wgsl';
const WG = 256;
const WG_F = 256;

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

  buffer(size, label, usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC
    | GPUBufferUsage.COPY_DST) {
    const b = this.device.createBuffer({ label: `probe.${label}`, size: align(size, 16), usage });
    this.owned.push(b);
    return b;
  }

  chunk(words) {
    const u = new Uint32Array(12);
    u.set(words);
    const b = this.buffer(48, 'chunk', GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    this.device.queue.writeBuffer(b, 0, u);
    return b;
  }

  async build() {
    const { opt, device: d } = this;
    const seg = opt.segPlan;
    this.before = this.buffer(opt.n * 4, 'before');       // W before the step, then the update
    this.partials = this.buffer(Math.max(seg.count, 1) * 8, 'partials');
    this.sums = [this.buffer(this.statsBytes, 'weight sums'), this.buffer(this.statsBytes, 'update sums')];
    const [reduce, tensor, delta] = await Promise.all([
      this.lib.pipeline(FILE, 'reduce_norm_sq', opt.reduceConsts, ['cu', 'segs', 'partials', 'g4']),
      this.lib.pipeline(FILE, 'finalize_tensor_stats', { WG_F }, ['tsegs', 'partials', 'stats']),
      this.lib.pipeline(FILE, 'weight_delta', { WG }, ['cu', 'w4', 'g4']),
    ]);
    const sums = (stats) => [
      ...opt.windows.map((win) => {
        const [pbase, pend] = windowSegments(seg.segs, seg.count, win.base, win.len);
        return launch(d, reduce, { cu: this.chunk([win.base, win.len / 4, pbase, pend - pbase]),
          segs: opt.segs, partials: this.partials, g4: this.range(this.before, win) },
        grid2d(pend - pbase), 'probe sums');
      }),
      launch(d, tensor, { tsegs: opt.tsegs, partials: this.partials, stats }, [this.T, 1],
        'probe tensor sums'),
    ];
    this.ops = [
      ...sums(this.sums[0]),
      ...opt.windows.map((win) => launch(d, delta, { cu: this.chunk([win.base, win.len / 4]),
        w4: this.range(opt.W, win), g4: this.range(this.before, win) },
      elementGrid(win.len, WG), 'probe delta')),
      ...sums(this.sums[1]),
    ];
  }

  range(buffer, win) {
    return { buffer, offset: win.base * 4, size: win.len * 4 };
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
