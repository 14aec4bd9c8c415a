// Launches of the mixed-precision matmul (mma.js) for kernels.js: the model's matmuls in its GEMM
// terms, the split-K rule, and the pipelines (compiled once per operand layout, in the builtins'
// spelling this Dawn takes).

import { MMA_TILE, mmaPlan, mmaShader } from './mma.js';

const cdiv = (a, b) => Math.ceil(a / b);
function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

// The mixed-precision matmul (mma.js, MMA_TILE) runs where its 128 x 128 x 32 tiles fill the
// problem exactly; its split-K (weight gradients only) gives the GPU about MMA_TARGET blocks, two
// per SM of an H200, each split at least MMA_MIN_INNER deep. A function of the shape only.
const MMA_TARGET = 264;
const MMA_MIN_INNER = 512;
const MMA = mmaPlan({ ...MMA_TILE, aT: 0, bT: 0 });

/** {fits, splits, KS} of the mixed-precision C[R, S] = sum over INNER (splits > 1: split-K)
 *  with the engine's tile, or another variant's plan (mma.js mmaPlan; the bench's). */
export function mmaSplit(R, S, INNER, allowSplit = true, tile = MMA) {
  const fits = R % tile.BM === 0 && S % tile.BN === 0 && INNER % tile.bk === 0;
  const tiles = (R / tile.BM) * (S / tile.BN);
  let splits = 1;
  if (allowSplit && tiles < MMA_TARGET) {
    splits = Math.max(1, Math.min(Math.floor(INNER / MMA_MIN_INNER), cdiv(MMA_TARGET, tiles)));
  }
  const KS = cdiv(cdiv(INNER, splits), tile.bk) * tile.bk;
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

  async pipeline(plan) {
    const { lib } = this.kernels;
    const key = JSON.stringify(plan);
    if (!this.pipes.has(key)) {
      this.pipes.set(key, (async () => {
        for (const syntax of this.syntax ? [this.syntax] : ['template', 'bool']) {
          try {
            const shader = await lib.compile(mmaShader({ ...plan, syntax }), `mma ${key}`);
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

  /** {op, splits}: the mixed-precision C[R, S] (= or += with accum) over INNER, A [R, INNER]
   *  (aT 0) or [INNER, R] (aT 1), B [INNER, S] (bT 0) or [S, INNER] (bT 1); bF16: B is the
   *  packed f16 mirror. With part (a weight gradient's scratch) the sum may be split: the op then
   *  writes `splits` partials there and the caller adds them into C (Kernels.addPartials, so
   *  accum must be set). null where the shape does not fill the tiles (the fp32 kernel runs). */
  async op({ a, b, c, part, R, S, INNER, aT, bT, accum, bF16 = false }, label) {
    const { fits, splits, KS } = mmaSplit(R, S, INNER, Boolean(part));
    if (!fits) return null;
    check(splits === 1 || accum, `${label}: a split sum is added into C: it needs accum`);
    check(splits === 1 || part.size >= 4 * splits * R * S, `${label}: split-K over ${splits} ` +
      `parts needs a part buffer of ${4 * splits * R * S} bytes`);
    const plan = { ...MMA_TILE, aT, bT, aIn: 'f32', bIn: bF16 ? 'f16' : 'f32', accum: accum && splits === 1 };
    const pipe = await this.pipeline(plan);
    const op = await this.kernels.opOf(pipe, 'dims', [R, S, INNER, KS],
      { a, b, c: splits === 1 ? c : part }, [S / MMA.BN, R / MMA.BM, splits], label);
    return { op: { ...op, file: 'mma.js', entry: 'main' }, splits };
  }
}
