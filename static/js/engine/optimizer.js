// The optimizer phase of a training step (12_optimizer.wgsl): per-tensor and global grad norms ->
// clip scales (global, per tensor or off) -> AdamW over the whole mega-buffer, encoded into the
// caller's command encoder.
//
//   const opt = await Optimizer.create(ctx, layout, {variant, W, G, maps, ...});
//   each step:  opt.setStep(step, lr);   // queue.writeBuffer of 64 bytes, before the submit
//               opt.encode(encoder);     // or opt.encodeInPass(pass) inside an open compute pass
//   opt.ops()   the step's dispatches as op records (ops.js), as the kernels' are: what encode()
//               encodes, in its order, for encodeOps and the profiler (profiler.js profileOps)
//   opt.stats   GPUBuffer f32 [4 + 4T] = (grad_norm, clip_scale, grad_norm^2, #non-finite grad
//               elements), then per tensor t of layout.params (sum of g^2, #non-finite, clip
//               scale, 0); STORAGE | COPY_SRC: copy opt.statsBytes of it into the trainer's
//               readback ring after encode(). readStats() decodes such a copy.
//   opt.scaler  (with lossScale) f32 [4] = (loss scale, clean steps, applied steps, 0): mixed
//               precision's dynamic loss scale, which the model's loss multiplies dlogits by
//               (07_loss scale_dlogits), and the count Adam's bias corrections use; stats then
//               ends with 8 more floats (the scale the step used, 1 if it was skipped, ...).
//   opt.mirror  (f16 variants) u32 [total_numel / 2]: element i of W as f16 in half i % 2 of word
//               i / 2, low half first; the tensor at element offset o starts at byte 2 * o.
//   opt.destroy()  frees every buffer it created (the mirror too, unless it was handed in).
//
// Pipelines are built once, bind groups once; encode() allocates nothing. Nothing here reads back.

import { align, checked } from './gpu.js';
import { packHalf2, prepare8 } from './optimizer_tables.js';
import { normSegments, windowSegments } from './norm_segments.js';
import {
  LOSS_SCALE_BINDINGS, LOSS_SCALE_STATS_BYTES, lossScaleStats, scalerInit,
} from './optimizer_loss_scale.js';
import { elementGrid, grid2d, plan8, planFp32, planWindows } from './optimizer_plans.js';
import { hyperUniform, mergeHyper } from './optimizer_hyper.js';
import { encodeDispatch, launch } from './ops.js';

export const FILE = '12_optimizer.wgsl';
export const VARIANTS = ['adamw', 'adamw_f16', 'adamw_8bit', 'adamw_8bit_f16'];
export const ENTRY = {   // the update's entry point per variant
  adamw: 'adamw_update', adamw_f16: 'adamw_update_f16',
  adamw_8bit: 'adamw_8bit_update', adamw_8bit_f16: 'adamw_8bit_update_f16',
};
// What each entry point binds, by the names 12_optimizer.wgsl declares (which give the binding
// numbers and types of its pipeline layout); the f16 variants' updates bind `mirror` as well.
const BINDINGS = {
  reduce_norm_sq: ['cu', 'segs', 'partials', 'g4'],
  finalize_tensor_stats: ['tsegs', 'partials', 'stats'],
  finalize_grad_stats: ['hp', 'stats', 'tsegs'],
  scale_tensor_grads: ['cu', 'segs', 'stats', 'g4'],
  adamw: ['hp', 'cu', 'stats', 'w4', 'g4', 'm4', 'v4'],
  adamw_8bit: ['hp', 'cu', 'stats', 'w4', 'g4', 'codes', 'small', 'tables'],
};
const VEC4_PER_THREAD = 16;      // norm: vec4s each thread sums before the workgroup tree (barriers
                                 // are what costs on CPU adapters)
const WG_FINAL = 256;            // finalize_* threads (a workgroup per tensor, then one)
// 8-bit: threads per block, 4 elements each, so the server's blocksize must be 256: the kernel's
// layout (WG8 = 64 * BPW there, in WGSL; tests/js/shaders.test.mjs holds the two equal).
export const BLOCK_THREADS = 64;
const BLOCK_ELEMS = 4 * BLOCK_THREADS;

const STORAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

export class Optimizer {
  /**
   * ctx (context.js: device, lib, limits, software), layout (server/model.py), and:
   *   variant       'adamw' | 'adamw_f16' | 'adamw_8bit' | 'adamw_8bit_f16'
   *   W, G          f32 mega-buffers of layout.total_numel elements (G is zeroed by each step)
   *   maps          {signed, unsigned, blocksize, min_8bit_size} (GET /api/optimizer/maps,
   *                 server/optim.py quantization_maps()), for the 8-bit variants; these also need
   *                 layout.optimizer_state.adamw_8bit (f32_tensors: the tensors that keep f32
   *                 state, q_blocks, f32_numel), as GET /api/presets/{name}/layout sends it
   *   mirror        optional u32 buffer for the f16 mirror (else one is created)
   *   hyper         {beta1, beta2, eps, weight_decay, max_norm, clip_mode}, all of them (a run
   *                 config's; changeable with setHyper). clip_mode 'global' | 'per_tensor' |
   *                 'off'; the older {clip: false} means 'off'.
   *   lossScale     null, or {init, growth} (mixed precision): dynamic loss scaling as
   *                 torch.amp.GradScaler (init 65536, growth interval 2000, x2 / x0.5): G is
   *                 divided by the scale before the norm, a step with a non-finite gradient is
   *                 skipped (W and the state unchanged, G zeroed) and halves the scale
   *   maxBindingBytes  test hook: pretend the binding limit is smaller (forces several chunks)
   *   wg, wgReduce, bpw, persistent, nwg8   kernel tuning; none changes a result bit (the
   *                 optimizer test checks). Defaults come from the context: ctx.limits bounds the
   *                 workgroup sizes, ctx.software picks smaller and fewer 8-bit workgroups (see
   *                 defaultGroups8); persistent: false runs one round of bpw blocks per workgroup.
   */
  static async create(ctx, layout, opts) {
    const opt = new Optimizer(ctx, layout, opts);
    await opt._build();
    return opt;
  }

  constructor(ctx, layout, { variant = 'adamw', W, G, maps = null, mirror = null, hyper = {},
    lossScale = null, maxBindingBytes = null, wg = 256, wgReduce = 256, bpw = ctx.software ? 2 : 4,
    persistent = true, nwg8 = null, label = 'opt' } = {}) {
    if (!VARIANTS.includes(variant)) throw new Error(`unknown optimizer variant ${variant}`);
    if (!W || !G) throw new Error('Optimizer needs the W and G mega-buffers');
    const { limits } = ctx;
    this.ctx = ctx;
    this.device = ctx.device;
    this.lib = ctx.lib;
    this.layout = layout;
    this.variant = variant;
    this.is8 = variant.startsWith('adamw_8bit');
    this.f16 = variant.endsWith('_f16');
    this.W = W;
    this.G = G;
    this.maps = maps;
    this.mirror = mirror;
    this.lossScale = lossScale ? { init: 65536, growth: 2000, ...lossScale } : null;   // GradScaler's
    // 8-bit blocks per workgroup: 64 threads each, within the device's workgroup size.
    bpw = Math.max(1, Math.min(bpw, Math.floor(limits.maxComputeInvocationsPerWorkgroup / BLOCK_THREADS)));
    this.tuning = { wg, wgReduce, bpw, persistent, nwg8 };
    this.label = label;
    this.n = layout.total_numel;
    if (this.n % 64 || layout.decay_numel % 64) {
      throw new Error('optimizer: total_numel and decay_numel must be multiples of 64 (server/model.py)');
    }
    const bindLimit = Math.min(limits.maxStorageBufferBindingSize, maxBindingBytes ?? Infinity);
    // Elements per window: a whole number of norm-partial spans (so every partial covers the same
    // elements however the range is split) whose f32 binding fits the limit.
    this.partialElems = 4 * wgReduce * VEC4_PER_THREAD;
    this.windowElems = Math.floor(bindLimit / 4 / this.partialElems) * this.partialElems;
    if (this.windowElems < this.partialElems) {
      throw new Error(`optimizer: binding limit ${bindLimit} B is too small`);
    }
    this.hyper = mergeHyper({}, hyper);
    this._hpData = new ArrayBuffer(64);
    this.notes = [];   // what the optimizer decided (splits), for the UI and logs
    this._passDesc = { label };
    this._chunks = [];   // per-window uniforms, destroyed with the optimizer
  }

  setHyper(h) {
    mergeHyper(this.hyper, h);
  }

  /** Storage buffers the update dispatch binds: fp32 stats, W, G, M, V; 8-bit stats, W, G, codes,
   *  small (absmax + f32 state), tables (packed so that both fit the default limit of 8); +1 mirror. */
  get storageBuffersNeeded() {
    return this.updateBindings.length - 2;   // all but the hp and cu uniforms
  }

  /** The update entry point's bindings (BINDINGS). */
  get updateBindings() {
    return [...BINDINGS[this.is8 ? 'adamw_8bit' : 'adamw'], ...(this.f16 ? ['mirror'] : [])];
  }

  async _build() {
    const d = this.device;
    const { wg, wgReduce, bpw, persistent, nwg8 } = this.tuning;
    const need = this.storageBuffersNeeded;
    const perStage = this.ctx.limits.maxStorageBuffersPerShaderStage;
    if (perStage < need) {
      throw new Error(`optimizer ${this.variant} needs ${need} storage buffers per shader stage; ` +
        `this device allows ${perStage}`);
    }
    // Element windows (fp32 update and the norm): [k * windowElems, ...) over [0, n).
    this.windows = planWindows(this.n, this.windowElems);
    if (this.windows.length > 1) {
      this.notes.push(`mega-buffer of ${this.n * 4} B split into ${this.windows.length} bindings ` +
        `(maxStorageBufferBindingSize ${this.windowElems * 4} B)`);
    }
    this.tensors = this.layout.params.length;
    this.statsBytes = 16 + 16 * this.tensors + (this.lossScale ? LOSS_SCALE_STATS_BYTES : 0);
    this.stats = this._buffer(this.statsBytes, 'stats');
    const skip = this.lossScale ? { SKIP_NONFINITE: 1 } : {};
    this.uHyper = d.createBuffer({ label: `${this.label}.hyper`, size: 64,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });

    // Norm partials: one per segment (norm_segments.js), summed per tensor in index order.
    const segPlan = normSegments(this.layout, this.partialElems);
    this.segPlan = segPlan;   // (tensorSumOps)
    this.segs = this._buffer(segPlan.segs.byteLength, 'segs', segPlan.segs);
    this.tsegs = this._buffer(segPlan.tsegs.byteLength, 'tsegs', segPlan.tsegs);
    this.partials = this._buffer(Math.max(segPlan.count, 1) * 8, 'partials');

    const reduceConsts = { WG_R: wgReduce, VPT: VEC4_PER_THREAD };
    const pipe = async (entry, constants, names = BINDINGS[entry]) =>
      ({ ...await this.lib.pipeline(FILE, entry, constants, names), entry });
    const pipes = {
      reduce: pipe('reduce_norm_sq', reduceConsts),
      tensor: pipe('finalize_tensor_stats', { WG_F: WG_FINAL }),
      final: pipe('finalize_grad_stats', { WG_F: WG_FINAL }),
      scale: pipe('scale_tensor_grads', reduceConsts),
    };
    let updatePlan;
    if (this.is8) {
      let t;
      ({ plan: this.plan, quant: this.quant, state8: this.state8, tables: t } =
        prepare8(this.layout, this.maps, BLOCK_ELEMS));
      this.tables = this._buffer(t.byteLength, 'tables', t);
      this.codes = this._buffer(Math.max(this.state8.codesBytes, 4), 'codes');
      this.small = this._buffer(Math.max(this.state8.smallFloats * 4, 16), 'small');
      this.stateBytes = this.state8.codesBytes + this.state8.smallFloats * 4;
      pipes.update = pipe(ENTRY[this.variant],
        { BPW: bpw, PERSISTENT: persistent ? 1 : 0, ...this.quant.constants, ...skip }, this.updateBindings);
      const planned = plan8(this.plan, { windowElems: this.windowElems, codesBytes: this.codes.size,
        bpw, persistent, nwg8, software: this.ctx.software });
      this.notes.push(...planned.notes);
      updatePlan = planned.dispatches;
    } else {
      this.M = this._buffer(this.n * 4, 'M');
      this.V = this._buffer(this.n * 4, 'V');
      this.stateBytes = 2 * this.n * 4;
      pipes.update = pipe(ENTRY[this.variant], { WG: wg, ...skip }, this.updateBindings);
      updatePlan = planFp32(this.windows, wg);
    }
    if (this.f16 && !this.mirror) {
      this.mirror = this._buffer(this.n * 2, 'mirror');
      this._ownsMirror = true;
    }
    if (this.lossScale) {
      this.scaler = this._buffer(16, 'scaler', scalerInit(this.lossScale));
      pipes.unscale = pipe('unscale_grads', { WG: wg }, LOSS_SCALE_BINDINGS.unscale_grads);
      pipes.bias = pipe('bias_correct', {}, LOSS_SCALE_BINDINGS.bias_correct);
      pipes.zero = pipe('zero_skipped_grads', { WG: wg }, LOSS_SCALE_BINDINGS.zero_skipped_grads);
      pipes.grow = pipe('update_loss_scale', { GROWTH: this.lossScale.growth },
        LOSS_SCALE_BINDINGS.update_loss_scale);
    }
    const p = Object.fromEntries(await Promise.all(Object.entries(pipes)
      .map(async ([k, v]) => [k, await v])));
    this.pUpdate = p.update;
    this._pipes = p;

    // The step's dispatches as op records, each with its uniforms and bind group made once.
    await checked(d, `optimizer ${this.variant} bind groups`, () => {
      const op = (pipeline, resources, grid, what) => this._op(pipeline, resources, grid, what);
      const ops = { unscale: [], scale: [], update: [], zero: [] };
      for (const win of this.windows) {
        const [pbase, pend] = windowSegments(segPlan.segs, segPlan.count, win.base, win.len);
        const g4 = this._range(this.G, win.base, win.len, 4);
        const seg = { cu: this.chunk({ base: win.base, n4: win.len / 4, pbase, nseg: pend - pbase }),
          segs: this.segs, g4 };
        ops.scale.push(op(p.scale, { ...seg, stats: this.stats }, grid2d(pend - pbase),
          'per-tensor clip'));
        if (this.lossScale) {
          const cu = this.chunk({ base: win.base, n4: win.len / 4 });
          const grid = elementGrid(win.len, wg);
          ops.unscale.push(op(p.unscale, { cu, g4, scaler: this.scaler }, grid, 'loss unscale'));
          ops.zero.push(op(p.zero, { cu, g4, stats: this.stats }, grid, 'skipped step'));
        }
      }
      ops.final = [op(p.final, { hp: this.uHyper, stats: this.stats, tsegs: this.tsegs }, [1, 1],
        'clip scale')];
      ops.grow = this.lossScale
        ? [op(p.grow, { stats: this.stats, scaler: this.scaler }, [1, 1], 'loss scale')] : [];
      ops.bias = this.lossScale ? [op(p.bias, { hp: this.uHyper, stats: this.stats,
        scaler: this.scaler }, [1, 1], 'bias correction')] : [];
      for (const u of updatePlan) {
        const res = { hp: this.uHyper, stats: this.stats,
          w4: this._range(this.W, u.base, u.len, 4), g4: this._range(this.G, u.base, u.len, 4) };
        if (this.is8) {
          Object.assign(res, {
            cu: this.chunk({ base: u.base, b0: u.b0, b1: u.b1, qbase: u.qbase,
              m32: this.state8.m32, v32: this.state8.v32 }),
            codes: { buffer: this.codes, offset: u.codesOffset, size: u.codesSize },
            small: this.small, tables: this.tables });
        } else {
          Object.assign(res, { cu: this.chunk({ base: u.base, n4: u.n4 }),
            m4: this._range(this.M, u.base, u.len, 4), v4: this._range(this.V, u.base, u.len, 4) });
        }
        if (this.f16) res.mirror = this._range(this.mirror, u.base, u.len, 2);
        ops.update.push(op(p.update, res, u.grid, 'update'));
      }
      // A step's lists, made once (encode() allocates nothing): the norm phase with and
      // without per-tensor clipping (setHyper may switch it), the update phase.
      const norm = [...ops.unscale, ...this.tensorSumOps(this.G, this.partials, this.stats),
        ...ops.final];
      this._ops = { norm, normPerTensor: [...norm, ...ops.scale],
        update: [...ops.bias, ...ops.update, ...ops.zero, ...ops.grow],
        updates: ops.update.length };
    });
  }

  _buffer(size, name, data = null) {
    const b = this.device.createBuffer({ label: `${this.label}.${name}`, size: align(size, 16),
      usage: STORAGE() });
    if (data) this.device.queue.writeBuffer(b, 0, data.buffer, data.byteOffset, data.byteLength);
    return b;
  }

  _op(pipeline, resources, grid, what) {
    return { ...launch(this.device, pipeline, resources, grid, `${this.label}.${pipeline.label}`),
      label: `optimizer ${what}`, file: FILE, entry: pipeline.entry };
  }

  /** Op records that sum the squares of `src` (an f32 buffer laid out as W) per tensor into
   *  `stats` ([4 + 4t]; [5 + 4t]: its non-finite count) through `partials` (8 bytes a norm
   *  segment): reduce_norm_sq per window, then finalize_tensor_stats. The step's norm runs them
   *  over G; the update probe (update_probe.js) over W's copy and the update. */
  tensorSumOps(src, partials, stats, words = ['grad norm', 'tensor norms']) {
    const { segs, count } = this.segPlan;
    return [
      ...this.windows.map((win) => {
        const [pbase, pend] = windowSegments(segs, count, win.base, win.len);
        const cu = this.chunk({ base: win.base, n4: win.len / 4, pbase, nseg: pend - pbase });
        return this._op(this._pipes.reduce, { cu, segs: this.segs, partials,
          g4: this._range(src, win.base, win.len, 4) }, grid2d(pend - pbase), words[0]);
      }),
      this._op(this._pipes.tensor, { tsegs: this.tsegs, partials, stats }, [this.tensors, 1],
        words[1]),
    ];
  }

  /** A Chunk uniform (12_optimizer.wgsl: base, n4, pbase, nseg, ...) made once, freed with the
   *  optimizer. */
  chunk(fields) {
    const u = new Uint32Array(12);
    const order = ['base', 'n4', 'pbase', 'nseg', 'b0', 'b1', 'qbase', '', 'm32', 'v32'];
    order.forEach((k, i) => { if (k) u[i] = fields[k] ?? 0; });
    const b = this.device.createBuffer({ label: `${this.label}.chunk`, size: 48,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    this.device.queue.writeBuffer(b, 0, u);
    this._chunks.push(b);
    return b;
  }

  _range(buffer, baseElems, lenElems, bytesPerElem) {
    return { buffer, offset: baseElems * bytesPerElem, size: lenElems * bytesPerElem };
  }

  /** Hyperparameters of step `step` (1-based) with learning rate `lr` (optimizer_hyper.js). */
  setStep(step, lr) {
    hyperUniform(this.hyper, this.layout.decay_numel, step, lr, this._hpData);
    this.device.queue.writeBuffer(this.uHyper, 0, this._hpData);
  }

  /** Phase 1 as op records: with loss scaling G unscaled first; per-segment sums of g^2,
   *  per-tensor sums, then grad_norm and the clip scales into `stats`; with per-tensor
   *  clipping, G scaled by each tensor's own. */
  normOps() {
    return this.hyper.clip_mode === 'per_tensor' ? this._ops.normPerTensor : this._ops.norm;
  }

  /** Phase 2 as op records: the AdamW update (reads clip_scale from `stats`, zeroes G); with
   *  loss scaling, first the step's bias corrections (from the applied steps), then after the
   *  update G zeroed after a skipped step and the scale updated. */
  updateOps() {
    return this._ops.update;
  }

  /** A whole optimizer step as op records, in the order encode() encodes them. */
  ops() {
    return [...this.normOps(), ...this.updateOps()];
  }

  /** Encode norm, finalize and update as one compute pass of `encoder`. */
  encode(encoder, { timestampWrites } = {}) {
    const pass = encoder.beginComputePass(timestampWrites
      ? { label: this.label, timestampWrites } : this._passDesc);
    this.encodeInPass(pass);
    pass.end();
  }

  /** The same dispatches inside an open compute pass (each dispatch sees the previous one's writes). */
  encodeInPass(pass) {
    this.encodeNorm(pass);
    this.encodeUpdate(pass);
  }

  /** Phase 1 (normOps) into an open compute pass. */
  encodeNorm(pass) {
    for (const op of this.normOps()) encodeDispatch(pass, op);
  }

  /** {grad_norm, clip_scale, nonfinite, tensor_sq: Float64Array [T], tensor_nonfinite: [T]}
   *  from opt.statsBytes bytes of `stats` at byte `offset` of `buffer` (an ArrayBuffer). */
  readStats(buffer, offset = 0) {
    const f = new Float32Array(buffer, offset, this.statsBytes / 4);
    const T = this.tensors;
    return {
      grad_norm: f[0], clip_scale: f[1], nonfinite: f[3],
      tensor_sq: Float64Array.from({ length: T }, (_, t) => f[4 + 4 * t]),
      tensor_nonfinite: Float64Array.from({ length: T }, (_, t) => f[5 + 4 * t]),
      ...(this.lossScale ? lossScaleStats(f, T) : {}),
    };
  }

  /** Phase 2 (updateOps) into an open compute pass. */
  encodeUpdate(pass) {
    for (const op of this.updateOps()) encodeDispatch(pass, op);
  }

  /** Number of update dispatches per step (1 unless a binding had to be split). */
  get updateDispatches() {
    return this._ops.updates;
  }

  /** The optimizer's part of a checkpoint, in the order server/optim.py checkpoint_sections
   *  lists it: fp32 variants M, V (f32 [n] each); 8-bit variants codes (u8 [2, 256] per 8-bit
   *  block: the codes buffer as the kernel keeps it) and small (f32: absmax pairs, then f32 m and
   *  v of the small tensors); with loss scaling (mixed precision) then the scaler (f32 [4]).
   *  bytes = what the buffer holds from its start (its allocation is rounded up). The f16 mirror
   *  is not state: it is recomputed from W (initMirror). */
  stateSections() {
    const scaler = this.lossScale ? [{ name: 'scaler', buffer: this.scaler, bytes: 16 }] : [];
    if (this.is8) {
      return [{ name: 'codes', buffer: this.codes, bytes: this.state8.codesBytes },
        { name: 'small', buffer: this.small, bytes: this.state8.smallFloats * 4 }, ...scaler];
    }
    return [{ name: 'M', buffer: this.M, bytes: this.n * 4 },
      { name: 'V', buffer: this.V, bytes: this.n * 4 }, ...scaler];
  }

  /** Host f32 weights -> the f16 mirror (once, when W is uploaded; steps keep it in sync). */
  initMirror(weights) {
    if (!this.mirror) throw new Error('this optimizer variant has no f16 mirror');
    const packed = packHalf2(weights);
    this.device.queue.writeBuffer(this.mirror, 0, packed);
  }

  /** Free the optimizer's buffers (the mirror too, unless it was handed in). */
  destroy() {
    for (const b of [this.stats, this.scaler, this.uHyper, this.partials, this.segs, this.tsegs, this.M, this.V, this.codes, this.small,
      this.tables, ...this._chunks, this._ownsMirror ? this.mirror : null]) {
      b?.destroy();
    }
  }
}
