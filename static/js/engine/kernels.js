// Kernel launchers: one small function per WGSL stage. Each checks its shapes, computes the
// grid and returns a recorded op (ops.js). Buffers are GPUBuffers or {buffer, offset, size}
// sub-ranges, bound by the names the WGSL gives its bindings (shaders.js: the pipeline's layout
// holds exactly the bindings an op names, typed as the WGSL declares them); shapes use B batch,
// T time, C channels, H heads, D head dim, F FFN width, V vocab, N = B*T rows.

import { rowAttention } from './attention_direct.js';
import { checked } from './gpu.js';
import { WIDE_BIG, WIDE_BIG_BYTES, matmulLaunch, weightGradSplit } from './matmul_tiles.js';
import { mmaAttentionFits } from './mma_attention.js';
import { MmaOps, mmaGemm } from './mma_ops.js';
import { f32bits, grid1d, launch, uniformWords } from './ops.js';

const GAIN_ROWS = 64;  // rows per partial sum of the norm-gain gradient

// Workgroup sizes. Each launcher passes its size to the WGSL `override WG` and computes its grid
// from the same constant, so the two cannot drift apart. The sizes of workgroup reductions (norm
// rows, cross entropy, loss mean) fix their summation trees: changing one changes result bits.
const WG_ELEMENT = 256;   // one thread per element: init, embed, rope, swiglu (+ backward), add_partials
const WG_VOCAB_ROW = 64;  // one workgroup per vocabulary row, threads over channels: embed backward
// One workgroup per row, tree-reduced: rmsnorm (+ backward) over C, cross entropy over V. Rows of
// up to SHORT_ROW elements get SHORT_ROW_THREADS threads, longer ones ROW_THREADS. A CPU adapter
// pays for every thread at each barrier of the tree: on SwiftShader, tiny's norms (C 64) run ~6x
// faster with 8 threads than with 64. A GPU wants the wider workgroups: with 8 threads, 12m's
// norms (C 384) took 2.5x as long on an H100 and its step 4% (fp32) to 9% (mixed) longer
// (bench/results/row_threads_h100.txt), so SHORT_ROW stops below 12m's width. A function of the
// row length only, so the summation tree, and the result bits, are the same on every adapter.
const SHORT_ROW = 256;
const SHORT_ROW_THREADS = 8;
const ROW_THREADS = 64;
const rowThreads = (len) => (len <= SHORT_ROW ? SHORT_ROW_THREADS : ROW_THREADS);
// A software adapter gives each row of SHORT_ROW_THREADS threads one thread instead: the files'
// *_direct entry points do the 8 threads' strided parts and their tree in one thread
// (lib/reduce.wgsl tree8_sum, tree8_max), the same operations in the same order, so the same
// bits, with no workgroup memory or barrier; DIRECT_ROWS_WG rows a workgroup. On SwiftShader
// tiny's norms and loss took ~17 of a ~135 ms step as workgroups (bench/results/tiny_swiftshader.txt).
const DIRECT_ROWS_WG = 64;
// Cross entropy's rows are a vocabulary long, and the presets' GPU vocabularies are 8192: its
// short rows reach further, to SHORT_VOCAB. At tiny's V 512 on SwiftShader the loss took 28.8 ms
// of a 233 ms step with 64 threads, 12.6 with 16, 5.4 with 8 (bench/results/tiny_swiftshader.txt).
const SHORT_VOCAB = 1024;
const lossThreads = (V) => (V <= SHORT_VOCAB ? SHORT_ROW_THREADS : ROW_THREADS);
const WG_COLUMN = 64;     // one thread per column: norm-gain sums
const WG_ATTENTION_ROWS = 64;   // rows per workgroup of the row attention kernels, one per thread
// Sequences from ATTENTION_TILED_T on take the tiled kernels (05_attention, 10_attention_backward):
// ATTENTION_BLOCK x ATTENTION_BLOCK score blocks, one row block per workgroup, passed as their
// `override BLK` (lib/attention.wgsl derives the workgroup from it: (BLK / 4)^2 threads of 4 x 4
// register tiles; its thread layout is written for 64). Shorter ones take the row kernels
// (*_rows.wgsl: one thread per row, WG_ATTENTION_ROWS rows per workgroup), which a CPU adapter runs
// ~5x faster at `tiny`'s T 64 (fewer barriers) and which leave a GPU little to gain there. A
// function of the shape only.
const ATTENTION_TILED_T = 128;
const ATTENTION_BLOCK = 64;

/** f32 words of the loss buffer of N tokens (07_loss.wgsl): per-token losses, the mean, the
 *  batch's max |logit| and min softmax denominator (at N + 1, N + 2), then per-token pairs. */
export const lossFloats = (N) => 3 * N + 4;

/** Floats of the attention backward's dS buffer: [B, H, T, T rounded up to 4] for the tiled
 *  kernels, 4 (bound, unused) for the row kernels below ATTENTION_TILED_T. mixedD: a mixed
 *  model's head dim; where its attention runs on the matrix units (mma_attention.js), dS is
 *  [B, H, T, T] f16, half the floats. */
export function attentionDsNumel(B, T, H, mixedD = 0) {
  if (T < ATTENTION_TILED_T) return 4;
  if (mixedD && mmaAttentionFits(T, mixedD)) return (B * H * T * T) / 2;
  return B * H * T * 4 * cdiv(T, 4);
}

/** qkv and dy bound a second time as vec4 arrays, for the tiled attention kernels (read when
 *  D % 4 == 0; a dy smaller than one vec4 cannot be, so qkv stands in for it otherwise). */
const attentionVec4s = (qkv, dy, D) => ({ qkv4: qkv, dy4: D % 4 === 0 ? dy : qkv });

/** Scratch floats the norm-gain gradient needs for N rows of C channels. */
export const gainPartialNumel = (N, C) => cdiv(N, GAIN_ROWS) * C;
const cdiv = (a, b) => Math.ceil(a / b);

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

export class Kernels {
  /** maxHeadDim: the attention kernels' head-dim limit, from the layout the server builds
   *  (layout.limits.max_head_dim, server/model.py MAX_HEAD_DIM). */
  constructor(device, lib, { maxHeadDim, mixed = false, software = false }) {
    if (!(maxHeadDim > 0)) throw new Error('Kernels needs maxHeadDim (layout.limits.max_head_dim)');
    this.device = device;
    this.lib = lib;
    this.maxHeadDim = maxHeadDim;
    // mixed: the linears' matmuls take f16 operands with f32 accumulation (mma.js) where their
    // shapes are multiples of 16 (mma_ops.js mmaTile); the context said it can (ctx.mixed, context.js).
    this.mixed = mixed;
    this.mma = mixed ? new MmaOps(this) : null;
    // software: a CPU adapter (ctx.software), whose fp32 matmuls take the direct kernel
    // (matmul_tiles.js matmulLaunch) and whose row attention takes attention_direct.js's
    // kernels; the same bits as the tiles and the row kernels.
    this.software = software;
    const lim = device.limits ?? {};
    this.bigTile = (lim.maxComputeWorkgroupStorageSize ?? 0) >= WIDE_BIG_BYTES
      && (lim.maxComputeInvocationsPerWorkgroup ?? 0) >= WIDE_BIG.WX * WIDE_BIG.WY;
  }

  /** One dispatch of `file`'s `entry` with `constants` over `grid`: `resources` binds storage
   *  buffers by their WGSL names, `dims` (u32 words; f32bits for f32 fields) the file's one
   *  uniform. The pipeline's layout is those bindings: an entry point binds what it touches. */
  async op(file, entry, constants, dims, resources, grid, label) {
    const uniform = (await this.lib.bindings(file)).find((b) => b.type === 'uniform').name;
    const p = await this.lib.pipeline(file, entry, constants, [uniform, ...Object.keys(resources)]);
    return { ...await this.opOf(p, uniform, dims, resources, grid, label), file, entry };
  }

  /** op() for a pipeline record `p` (shaders.js) whose uniform is named `uniform`. */
  opOf(p, uniform, dims, resources, grid, label) {
    return checked(this.device, label, () => {
      // The op owns its uniform: the holder of the op list frees it (ops.js releaseOps).
      const u = uniformWords(this.device, dims, `${label}.dims`);
      try {
        return { ...launch(this.device, p, { [uniform]: u, ...resources }, grid, label), owned: [u] };
      } catch (e) {
        u.destroy();
        throw e;
      }
    });
  }

  /** x[N, C] = wte[tokens[n]] */
  embed({ tokens, wte, x, N, C }) {
    return this.op('01_embed.wgsl', 'main', { WG: WG_ELEMENT }, [N, C], { tokens, wte, x },
      grid1d(cdiv(N * C, WG_ELEMENT)), 'embed');
  }

  /** dwte[V, C] += rows of dx grouped by token; buckets: tokenBuckets of the batch's tokens */
  embedBackward({ buckets, dx, dwte, N, C, V }) {
    return this.op('08_embed_backward.wgsl', 'main', { WG: WG_VOCAB_ROW }, [N, C, V],
      { buckets, dx, dwte }, grid1d(V), 'embed_backward');
  }

  /** How a row kernel's `entry` runs over N rows of `threads` threads a row: a workgroup a row,
   *  or on a software adapter at SHORT_ROW_THREADS a thread a row (`entry`_direct). */
  rowLaunch(entry, threads, N) {
    if (this.software && threads === SHORT_ROW_THREADS) {
      return { entry: `${entry}_direct`, constants: { DWG: DIRECT_ROWS_WG },
        grid: grid1d(cdiv(N, DIRECT_ROWS_WG)) };
    }
    return { entry, constants: { WG: threads }, grid: grid1d(N) };
  }

  /** y[N, C] = rmsnorm(x) * g; rstd[N] */
  rmsnorm({ x, g, y, rstd, N, C, eps }) {
    const { entry, constants, grid } = this.rowLaunch('rmsnorm_forward', rowThreads(C), N);
    return this.op('02_norm.wgsl', entry, constants, [N, C, f32bits(eps)], { x, g, y, rstd }, grid,
      'rmsnorm');
  }

  /** dx[N, C] (= or += with accum) from dy, x, g, rstd */
  rmsnormBackward({ dy, x, g, rstd, dx, N, C, accum }) {
    const { entry, constants, grid } = this.rowLaunch('rmsnorm_backward_input', rowThreads(C), N);
    return this.op('08_norm_backward.wgsl', entry, { ...constants, ACCUM: accum ? 1 : 0 }, [N, C],
      { dy, x, g, rstd, out: dx }, grid, 'rmsnorm_backward');
  }

  /** dg[C] += sum over rows of dy * x * rstd; part: scratch of gainPartialNumel(N, C) floats */
  rmsnormBackwardGain({ dy, x, rstd, dg, part, N, C }) {
    const chunks = cdiv(N, GAIN_ROWS);
    const dims = [N, C, GAIN_ROWS, chunks];
    return Promise.all([
      this.op('08_norm_backward.wgsl', 'gain_partial', { WG: WG_COLUMN }, dims,
        { dy, x, rstd, part }, [cdiv(C, WG_COLUMN), chunks], 'rmsnorm_backward_gain'),
      this.op('08_norm_backward.wgsl', 'gain_finish', { WG: WG_COLUMN }, dims,
        { out: dg, part }, [cdiv(C, WG_COLUMN), 1], 'rmsnorm_backward_gain_sum'),
    ]);
  }

  /** The fp32 matmul_core launch of an [R, S] output over `inner` on this adapter. */
  matmul(R, S, inner, weightGrad = false) {
    return matmulLaunch(R, S, inner, { bigOk: this.bigTile, weightGrad, software: this.software });
  }

  /** y[M, N] (= or +=) x[M, K] @ W[N, K]^T ; wF16 reads W from the packed f16 mirror */
  async linear({ x, w, y, M, N, K, accum = false, wF16 = false }) {
    const mm = await this.mma?.op({ a: x, b: w, c: y, ...mmaGemm('fwd', M, N, K), accum,
      bF16: wF16 }, 'linear');
    if (mm) return mm.op;
    const { entry, constants, groups } = this.matmul(M, N, K);
    return this.op('03_linear.wgsl', entry,
      { ACCUM: accum ? 1 : 0, W_F16: wF16 ? 1 : 0, ...constants },
      [M, N, K, 0], { x, w, y }, groups, 'linear');
  }

  /** dx[M, K] = dy[M, N] @ W[N, K] */
  async linearBackwardInput({ dy, w, dx, M, N, K, wF16 = false }) {
    const mm = await this.mma?.op({ a: dy, b: w, c: dx, ...mmaGemm('dx', M, N, K), accum: false,
      bF16: wF16 }, 'linear_backward_input');
    if (mm) return mm.op;
    const { entry, constants, groups } = this.matmul(M, K, N);
    return this.op('11_linear_backward.wgsl', entry,
      { MODE: 0, W_F16: wF16 ? 1 : 0, ...constants },
      [M, K, N, 0], { dy, w, out: dx }, groups, 'linear_backward_input');
  }

  /** dW[N, K] += dy[M, N]^T @ x[M, K]; part: scratch of weightGradPartNumel(M, N, K) floats
   *  (split-K partial sums, added into dW in a fixed order). The WGSL's `w` binding holds x here. */
  async linearBackwardWeight({ dy, x, dw, part, M, N, K }) {
    const label = 'linear_backward_weight';
    const mm = await this.mma?.op({ a: dy, b: x, c: dw, part, ...mmaGemm('dW', M, N, K),
      accum: true }, label);
    if (mm) return mm.splits === 1 ? mm.op : Promise.all([mm.op, this.addPartials(part, dw, N, K, mm.splits)]);
    const { splits, rows } = weightGradSplit(M, N, K);
    const { entry, constants, groups } = this.matmul(N, K, M, true);
    if (splits === 1) {
      return this.op('11_linear_backward.wgsl', entry, { MODE: 1, ...constants }, [N, K, M, 0],
        { dy, w: x, out: dw }, groups, label);
    }
    const need = 4 * splits * N * K;
    check(part && part.size >= need, `${label}: split-K over ${splits} parts needs a part ` +
      `buffer of ${need} bytes`);
    return Promise.all([
      this.op('11_linear_backward.wgsl', entry, { MODE: 2, ...constants }, [N, K, M, rows],
        { dy, w: x, out: part }, [...groups, splits], label),
      this.addPartials(part, dw, N, K, splits),
    ]);
  }

  /** dw[N, K] += the sum of `splits` split-K partials in part, in a fixed order. */
  addPartials(part, dw, N, K, splits) {
    return this.op('11_linear_backward.wgsl', 'add_partials', { WG: WG_ELEMENT }, [N, K, splits, 0],
      { dy: part, out: dw }, grid1d(cdiv(N * K, WG_ELEMENT)), 'linear_backward_weight');
  }

  /** RoPE on the q and k thirds of qkv[N, 3C], in place; inverse for backward */
  rope({ qkv, table, N, T, H, D, inverse = false }) {
    check(D % 2 === 0, `RoPE needs an even head dim, got ${D}`);
    // N * 2 (q, k) * H * D/2 rotated pairs, one thread each
    return this.op('04_rope.wgsl', 'main', { WG: WG_ELEMENT, INVERSE: inverse ? 1 : 0 },
      [N, T, H, D, H * D], { qkv, cs: table }, grid1d(cdiv(N * H * D, WG_ELEMENT)),
      inverse ? 'rope_backward' : 'rope');
  }

  attentionDims(B, T, H, D) {
    check(D <= this.maxHeadDim, `attention supports head dim <= ${this.maxHeadDim}, got ${D}`);
    return [B, T, H, D, H * D, f32bits(1 / Math.sqrt(D))];
  }

  /** probs[B, H, T, T]: a forward's attention probabilities from its qkv and lse (the
   *  attention maps' view; 05_attention_probs.wgsl). */
  attentionProbs({ qkv, lse, probs, B, T, H, D }) {
    return this.op('05_attention_probs.wgsl', 'main', { WG: WG_ELEMENT },
      this.attentionDims(B, T, H, D), { qkv, lse, probs },
      grid1d(cdiv(B * H * T * T, WG_ELEMENT)), 'attention_probs');
  }

  /** y[B, T, C] = causal softmax attention of qkv; lse[B, H, T] */
  attention({ qkv, y, lse, B, T, H, D }) {
    const dims = this.attentionDims(B, T, H, D);
    // Mixed: on the matrix units (mma_attention.js) where the shape fits.
    if (this.mma?.attentionFits(T, D)) return this.mma.attention({ qkv, y, lse, B, T, H, D }, dims);
    if (T < ATTENTION_TILED_T) {
      // Staged K and V tiles take 2 * KT * D * 4 bytes: 16 KiB, WebGPU's default limit.
      const { file, suffix } = rowAttention(this.lib, this.software, 'forward', D);
      return this.op(file, `main${suffix}`,
        { WG: WG_ATTENTION_ROWS, HD: D, KT: D > 64 ? 16 : 32 }, dims, { qkv, y, lse },
        grid1d(B * H * cdiv(T, WG_ATTENTION_ROWS)), 'attention');
    }
    // Workgroup memory 16 KiB, WebGPU's default limit; qkv is bound again as vec4s (qkv4).
    return this.op('05_attention.wgsl', 'main', { BLK: ATTENTION_BLOCK, HD: D }, dims,
      { qkv, y, lse, qkv4: qkv }, grid1d(B * H * cdiv(T, ATTENTION_BLOCK)), 'attention');
  }

  /** delta[B, H, T] = dO . y: the tiled backward's first pass (c: its pipeline constants). */
  attentionDelta({ qkv, y, dy, delta, B, T, H, D }, dims, c) {
    return this.op('10_attention_backward.wgsl', 'attention_backward_delta', c, dims,
      { qkv, y, dy, delta, ...attentionVec4s(qkv, dy, D) },
      grid1d(B * H * cdiv(T, ATTENTION_BLOCK)), 'attention_backward_delta');
  }

  /** dqkv[B, T, 3C] (and delta[B, H, T]) from the forward's qkv, y, lse and dy. ds: the dS
   *  buffer, attentionDsNumel(B, T, H) floats (with the head dim for a mixed model) to take dS
   *  through memory (dq then skips the scores), or 4 floats where the adapter cannot bind that
   *  many: both give the same bits. */
  attentionBackward({ qkv, y, dy, lse, delta, dqkv, ds, B, T, H, D }) {
    const dims = this.attentionDims(B, T, H, D);
    // Mixed: delta as below, then dq and dk/dv on the matrix units (mma_attention.js) where the
    // shape fits.
    if (this.mma?.attentionFits(T, D)) {
      const viaDs = T >= ATTENTION_TILED_T && ds.size >= 4 * attentionDsNumel(B, T, H, D);
      return Promise.all([
        this.attentionDelta({ qkv, y, dy, delta, B, T, H, D }, dims,
          { BLK: ATTENTION_BLOCK, HD: D, DS: 0 }),
        this.mma.attentionBackward({ qkv, dy, lse, delta, dqkv, ds: viaDs ? ds : null,
          B, T, H, D }, dims),
      ]).then((ops) => ops.flat());
    }
    if (T < ATTENTION_TILED_T) {
      const c = { WG: WG_ATTENTION_ROWS, HD: D, KT: D > 64 ? 8 : 16 };   // staged tiles under 16 KiB
      const { file, suffix } = rowAttention(this.lib, this.software, 'backward', D);
      const res = { qkv, y, dy, lse, delta, dqkv };
      const grid = grid1d(B * H * cdiv(T, WG_ATTENTION_ROWS));
      return Promise.all(['attention_backward_dq', 'attention_backward_dkdv'].map((entry) =>
        this.op(file, entry + suffix, c, dims, res, grid, entry)));
    }
    const res = { qkv, y, dy, lse, delta, dqkv, ...attentionVec4s(qkv, dy, D), ds4: ds };
    const file = '10_attention_backward.wgsl';
    const grid = grid1d(B * H * cdiv(T, ATTENTION_BLOCK));
    if (ds.size >= 4 * attentionDsNumel(B, T, H)) {
      // dS through memory: delta (which reads y and dy only), then dk/dv (storing dS), then dq
      // from dS
      const c = { BLK: ATTENTION_BLOCK, HD: D, DS: 1 };
      return Promise.all([
        this.attentionDelta({ qkv, y, dy, delta, B, T, H, D }, dims, c),
        this.op(file, 'attention_backward_dkdv', c, dims, res, grid, 'attention_backward_dkdv'),
        this.op(file, 'attention_backward_dq', c, dims, res, grid, 'attention_backward_dq'),
      ]);
    }
    const c = { BLK: ATTENTION_BLOCK, HD: D, DS: 0 };
    return Promise.all([
      this.op(file, 'attention_backward_dq', c, dims, res, grid, 'attention_backward_dq'),
      this.op(file, 'attention_backward_dkdv', c, dims, res, grid, 'attention_backward_dkdv'),
    ]);
  }

  /** h[N, F] = silu(gate) * up from gu[N, 2F] */
  swiglu({ gu, h, N, F }) {
    return this.op('06_swiglu.wgsl', 'main', { WG: WG_ELEMENT }, [N, F], { gu, h },
      grid1d(cdiv(N * F, WG_ELEMENT)), 'swiglu');
  }

  /** dgu[N, 2F] from dh[N, F] and gu */
  swigluBackward({ gu, dh, dgu, N, F }) {
    return this.op('09_ffn_backward.wgsl', 'main', { WG: WG_ELEMENT }, [N, F], { gu, dh, dgu },
      grid1d(cdiv(N * F, WG_ELEMENT)), 'swiglu_backward');
  }

  /** losses[lossFloats(N)]: per-row CE, the mean at [N], logit stats (07_loss.wgsl); logits
   *  become dlogits when writeGrad */
  crossEntropy({ logits, targets, losses, N, V, writeGrad = true }) {
    return Promise.all([
      this.crossEntropyRows({ logits, targets, losses, N, V, writeGrad }),
      this.lossMean({ losses, N, V, writeGrad }),
    ]);
  }

  /** crossEntropy's per-row part for rows [row0, row0 + rows) of the N: logits [rows, V] holds
   *  just those rows (a loss chunk, model.js); the losses land at the rows' batch indices, the
   *  dlogits are divided by N, so each row's bits are those of a whole-batch launch. */
  crossEntropyRows({ logits, targets, losses, N, V, row0 = 0, rows = N, writeGrad = true }) {
    check(row0 + rows <= N, `cross_entropy: rows ${row0} + ${rows} are past the batch's ${N}`);
    const { entry, constants, grid } = this.rowLaunch('cross_entropy', lossThreads(V), rows);
    return this.op('07_loss.wgsl', entry, { ...constants, WRITE_GRAD: writeGrad ? 1 : 0 },
      [N, V, row0, rows], { logits, targets, losses }, grid, 'cross_entropy');
  }

  /** losses[N] = the mean of the N per-row losses, and the batch's logit stats (07_loss.wgsl);
   *  after every row's crossEntropyRows. */
  lossMean({ losses, N, V, writeGrad = true }) {
    // WRITE_GRAD changes nothing here; passed so the pipeline is the one crossEntropy made.
    return this.op('07_loss.wgsl', 'loss_mean', { WG: lossThreads(V), WRITE_GRAD: writeGrad ? 1 : 0 },
      [N, V, 0, N], { losses }, [1, 1], 'loss_mean');
  }

  /** logits[N, V] (= dlogits) *= scaler[0], mixed precision's loss scale (07_loss.wgsl); N: the
   *  rows logits holds (a loss chunk's) */
  scaleDlogits({ logits, scaler, N, V }) {
    return this.op('07_loss.wgsl', 'scale_dlogits', { WG: WG_ELEMENT }, [N, V, 0, N],
      { logits, scaler }, grid1d(cdiv(N * V, WG_ELEMENT)), 'loss_scale');
  }

  /** A room's int8 pseudo-gradient of version - weights [numel] (13_room_delta.wgsl):
   *  scales[blocks of 256] and codes[blocks * 64] (u32, four codes each) */
  roomDeltaInt8({ version, weights, scales, codes, numel }) {
    const grid = grid1d(cdiv(numel, 256));
    return this.op('13_room_delta.wgsl', 'encode_int8', {}, [numel, grid[0]],
      { version, weights, scales, codes }, grid, 'room_delta_int8');
  }

  /** An overlapped room worker's move (14_room_move.wgsl): since[numel] = weights - since (the
   *  steps since the round's end), then, with the next version set, weights = version + since
   *  (and the f16 mirror of them where one is given). -> [steps_since, move_onto] */
  async roomMove({ weights, version, since, mirror = null, numel }) {
    const file = '14_room_move.wgsl';
    const pairs = cdiv(numel, 2);
    const dims = [numel, pairs];
    return [
      await this.op(file, 'steps_since', { WG: WG_ELEMENT }, dims, { weights, since },
        grid1d(cdiv(numel, WG_ELEMENT)), 'room_steps_since'),
      await this.op(file, mirror ? 'move_onto_f16' : 'move_onto', { WG: WG_ELEMENT }, dims,
        { weights, version, since, ...(mirror ? { mirror } : {}) },
        grid1d(cdiv(pairs, WG_ELEMENT)), 'room_move_onto'),
    ];
  }

  /** An int8 room's next version applied to the one held (15_room_update.wgsl): version[numel]
   *  += codes * scales of body (u32, the int8 update zero-padded to whole words), weights =
   *  version (and the f16 mirror of it where one is given). */
  roomUpdate({ body, version, weights, mirror = null, numel }) {
    const pairs = cdiv(numel, 2);
    return this.op('15_room_update.wgsl', mirror ? 'apply_update_f16' : 'apply_update',
      { WG: WG_ELEMENT }, [numel, pairs, cdiv(numel, 256), 0],
      { body, version, weights, ...(mirror ? { mirror } : {}) },
      grid1d(cdiv(pairs, WG_ELEMENT)), 'room_update');
  }

  /** Fill w[numel] from a seeded normal (std) or with ones */
  init({ w, numel, seed, stream, mode, std }) {
    return this.op('00_init.wgsl', 'main', { WG: WG_ELEMENT },
      [numel, seed >>> 0, mode, f32bits(std), stream], { w }, grid1d(cdiv(numel, WG_ELEMENT)), 'init');
  }
}
