// Launches of the mixed-precision matmul (mma.js) for kernels.js: the model's matmuls in its GEMM
// terms, the split-K rule, and the pipelines (compiled once per operand layout, in the builtins'
// spelling this Dawn takes).

import { MMA_TILE, mmaPlan, mmaShader } from './mma.js';
import { attentionDkdvShader, attentionDqFromDsShader, attentionDqShader, attentionForwardShader,
  mmaAttentionBytes, mmaAttentionFits } from './mma_attention.js';
import { grid1d } from './ops.js';

const cdiv = (a, b) => Math.ceil(a / b);
function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

// The mixed-precision matmul (mma.js) runs where the problem is a whole number of its tiles: the
// engine's 128 x 128 x 32 tile (MMA_TILE) where it fits, else the largest of a ladder of smaller
// ones (rows and columns of 64, 32 or 16 each, slices of 32 or 16), so that `tiny` and custom
// shapes whose sizes are multiples of 16 run mixed too; only others fall back to the fp32
// kernels. Every tile sums each output's products in the same order (16-deep steps along the
// reduction, from its start), so the tile changes no result; split-K does. Its split (weight
// gradients only) gives the GPU about MMA_TARGET blocks, two per SM of an H200, each split at
// least MMA_MIN_INNER deep. A function of the shape only.
const MMA_TARGET = 264;
const MMA_MIN_INNER = 512;
// Block sides, the smallest first, as [subgroups, 16 x 16 tiles per subgroup] along the side.
const SIDES = [[1, 1], [2, 1], [2, 2], [2, 4]];     // 16, 32, 64, 128
const SLICES = [32, 16];

/** Whether plan p (mma.js mmaPlan) is a whole number of its blocks over C[R, S] and INNER, and
 *  its slices a whole number of 8-element vector loads per thread (mma.js stager). */
function fills(p, R, S, INNER) {
  return R % p.BM === 0 && S % p.BN === 0 && INNER % p.bk === 0
    && (p.BM * p.bk) % (8 * p.threads) === 0 && (p.BN * p.bk) % (8 * p.threads) === 0;
}

/** The tile ({sgm, sgn, tm, tn, bk}, MMA_TILE's shape) of C[R, S] over INNER: MMA_TILE where it
 *  fits, else the ladder's largest block (then deepest slice) that fills the problem; null where
 *  none does. */
export function mmaTile(R, S, INNER) {
  const planOf = (t) => mmaPlan({ ...t, aT: 0, bT: 0 });
  if (fills(planOf(MMA_TILE), R, S, INNER)) return MMA_TILE;
  let best = null;
  for (const [sgm, tm] of SIDES) {
    for (const [sgn, tn] of SIDES) {
      for (const bk of SLICES) {
        const t = { sgm, sgn, tm, tn, bk, nbuf: MMA_TILE.nbuf };
        const p = planOf(t);
        const area = p.BM * p.BN;
        if (fills(p, R, S, INNER) && (!best || area > best.area
          || (area === best.area && bk > best.t.bk))) best = { t, area };
      }
    }
  }
  return best && Object.freeze(best.t);
}

/** {fits, splits, KS} of the mixed-precision C[R, S] = sum over INNER (splits > 1: split-K)
 *  with the tile mmaTile picks, or another variant's plan (mma.js mmaPlan; the bench's). */
export function mmaSplit(R, S, INNER, allowSplit = true, tile = undefined) {
  const t = tile ?? mmaTile(R, S, INNER);
  if (!t) return { fits: false, splits: 1, KS: INNER };
  const p = t.BM ? t : mmaPlan({ ...t, aT: 0, bT: 0 });
  const fits = R % p.BM === 0 && S % p.BN === 0 && INNER % p.bk === 0;
  const tiles = (R / p.BM) * (S / p.BN);
  let splits = 1;
  if (allowSplit && tiles < MMA_TARGET) {
    splits = Math.max(1, Math.min(Math.floor(INNER / MMA_MIN_INNER), cdiv(MMA_TARGET, tiles)));
  }
  const KS = cdiv(cdiv(INNER, splits), p.bk) * p.bk;
  return { fits, splits: cdiv(INNER, KS), KS };
}

/** The model's matmuls in the kernel's GEMM terms (mma.js): C[R, S] over INNER, the A and B
 *  layouts, for kind 'fwd' (y = x W^T), 'dx' (dx = dy W) or 'dW' (dW = dy^T x) of x[M, K],
 *  W[N, K], dy[M, N]. */
export function mmaGemm(kind, M, N, K) {
  if (kind === 'fwd') return { R: M, S: N, INNER: K, aT: 0, bT: 1 };
  if (kind === 'dx') return { R: M, S: K, INNER: N, aT: 0, bT: 0 };
  return { R: N, S: K, INNER: M, aT: 1, bT: 0 };
}

export class MmaOps {
  /** kernels: the Kernels whose lib and launch helper (opOf) these use. */
  constructor(kernels) {
    this.kernels = kernels;
    this.pipes = new Map();
    this.syntax = null;   // the builtins' spelling this Dawn takes (mma.js), found once
  }

  /** The pipeline of the WGSL source(syntax) makes (entry `main`), compiled once per key. */
  async pipeline(key, source) {
    const { lib } = this.kernels;
    if (!this.pipes.has(key)) {
      this.pipes.set(key, (async () => {
        for (const syntax of this.syntax ? [this.syntax] : ['template', 'bool']) {
          try {
            const shader = await lib.compile(source(syntax), key);
            this.syntax = syntax;
            return await lib.pipelineOf(shader, 'main');
          } catch (e) {
            if (syntax === 'bool' || this.syntax) throw e;
          }
        }
        throw new Error('unreachable');
      })());
    }
    return this.pipes.get(key);
  }

  /** Whether causal attention of T rows, head dim D runs on the matrix units here
   *  (mma_attention.js: the shape, and this device's workgroup memory). */
  attentionFits(T, D) {
    const wgMem = this.kernels.device.limits?.maxComputeWorkgroupStorageSize ?? 0;
    return mmaAttentionFits(T, D) && Math.max(...Object.values(mmaAttentionBytes(D))) <= wgMem;
  }

  /** The op of attention kernel `entry` (mma_attention.js `source(D, syntax)`; `variant` tells
   *  its pipelines apart), one workgroup per 64-row block (dims: Kernels.attentionDims). */
  async attentionOp(entry, variant, source, resources, { B, T, H, D }, dims, label) {
    const pipe = await this.pipeline(`mma attention ${entry}${variant} D${D}`,
      (syntax) => source(D, syntax));
    const op = await this.kernels.opOf(pipe, 'dims', dims, resources, grid1d(B * H * (T / 64)),
      label);
    return { ...op, file: 'mma_attention.js', entry };
  }

  /** The forward's op: y[B, T, C], lse[B, H, T]. */
  attention({ qkv, y, lse, ...shape }, dims) {
    return this.attentionOp('forward', '', attentionForwardShader, { qkv, y, lse }, shape, dims,
      'attention');
  }

  /** The backward's ops after delta (10_attention_backward's attention_backward_delta: dO . y in
   *  f32), into dqkv. With ds (scale * dS in f16, B H T T halves: Kernels.attentionBackward
   *  passes it where it holds them), dk/dv store dS and dq reads it (as the fp32 kernels' DS path
   *  does); else dq recomputes it. Both give dq the same bits. */
  attentionBackward({ qkv, dy, lse, delta, dqkv, ds, ...shape }, dims) {
    const res = { qkv, dy, lse, delta, dqkv };
    const op = (entry, variant, source, resources) => this.attentionOp(entry, variant, source,
      resources, shape, dims, `attention_backward_${entry}`);
    if (ds) {
      return Promise.all([
        op('dkdv', ' ds', (D, syntax) => attentionDkdvShader(D, syntax, true), { ...res, ds }),
        op('dq', ' from ds', attentionDqFromDsShader, { qkv, ds, dqkv }),
      ]);
    }
    return Promise.all([op('dq', '', attentionDqShader, res),
      op('dkdv', '', attentionDkdvShader, res)]);
  }

  /** {op, splits}: the mixed-precision C[R, S] (= or += with accum) over INNER, A [R, INNER]
   *  (aT 0) or [INNER, R] (aT 1), B [INNER, S] (bT 0) or [S, INNER] (bT 1); bF16: B is the
   *  packed f16 mirror. With part (a weight gradient's scratch) the sum may be split: the op then
   *  writes `splits` partials there and the caller adds them into C (Kernels.addPartials, so
   *  accum must be set). null where no tile fills the shape (mmaTile: the fp32 kernel runs). */
  async op({ a, b, c, part, R, S, INNER, aT, bT, accum, bF16 = false }, label) {
    const tile = mmaTile(R, S, INNER);
    if (!tile) return null;
    const { splits, KS } = mmaSplit(R, S, INNER, Boolean(part), tile);
    check(splits === 1 || accum, `${label}: a split sum is added into C: it needs accum`);
    check(splits === 1 || part.size >= 4 * splits * R * S, `${label}: split-K over ${splits} ` +
      `parts needs a part buffer of ${4 * splits * R * S} bytes`);
    const plan = { ...tile, aT, bT, aIn: 'f32', bIn: bF16 ? 'f16' : 'f32', accum: accum && splits === 1 };
    const { BM, BN } = mmaPlan(plan);
    const pipe = await this.pipeline(`mma ${JSON.stringify(plan)}`,
      (syntax) => mmaShader({ ...plan, syntax }));
    const op = await this.kernels.opOf(pipe, 'dims', [R, S, INNER, KS],
      { a, b, c: splits === 1 ? c : part }, [S / BN, R / BM, splits], label);
    return { op: { ...op, file: 'mma.js', entry: 'main' }, splits };
  }
}
