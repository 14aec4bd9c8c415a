// Launches of the mixed-precision matmul (mma.js) for kernels.js: the split-K rule, the
// pipelines (compiled once per operand layout, in the builtins' spelling this Dawn takes) and the
// ops, a split's partial slabs summed in a fixed order.

import { checked } from './gpu.js';
import { MMA_TILE, addSlabsShader, mmaPlan, mmaShader } from './mma.js';
import { grid1d, launch, uniformWords } from './ops.js';

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

/** {fits, splits, KS} of the mixed-precision C[R, S] = sum over INNER (splits > 1: split-K). */
export function mmaSplit(R, S, INNER, allowSplit = true) {
  const fits = R % MMA.BM === 0 && S % MMA.BN === 0 && INNER % MMA.bk === 0;
  const tiles = (R / MMA.BM) * (S / MMA.BN);
  let splits = 1;
  if (allowSplit && tiles < MMA_TARGET) {
    splits = Math.max(1, Math.min(Math.floor(INNER / MMA_MIN_INNER), cdiv(MMA_TARGET, tiles)));
  }
  const KS = cdiv(cdiv(INNER, splits), MMA.bk) * MMA.bk;
  return { fits, splits: cdiv(INNER, KS), KS };
}

export class MmaOps {
  constructor(device, lib) {
    this.device = device;
    this.lib = lib;
    this.pipes = new Map();
    this.syntax = null;   // the builtins' spelling this Dawn takes (mma.js), found once
  }

  async pipeline(plan) {
    const key = JSON.stringify(plan);
    if (!this.pipes.has(key)) {
      this.pipes.set(key, (async () => {
        for (const syntax of this.syntax ? [this.syntax] : ['template', 'bool']) {
          try {
            const shader = await this.lib.compile(mmaShader({ ...plan, syntax }), `mma ${key}`);
            this.syntax = syntax;
            return await this.lib.pipelineOf(shader, 'main');
          } catch (e) {
            if (syntax === 'bool' || this.syntax) throw e;
          }
        }
        throw new Error('unreachable');
      })());
    }
    return this.pipes.get(key);
  }

  /** The mixed-precision C[R, S] (= or += with accum) over INNER: A [R, INNER] (aT 0) or
   *  [INNER, R] (aT 1), B [INNER, S] (bT 0) or [S, INNER] (bT 1); bF16: B is the packed f16
   *  mirror. null where the shape does not fill the tiles (the caller runs the fp32 kernel). */
  async op({ a, b, c, part, R, S, INNER, aT, bT, accum, bF16 = false }, label) {
    const { fits, splits, KS } = mmaSplit(R, S, INNER, Boolean(part));
    if (!fits) return null;
    const plan = { ...MMA_TILE, aT, bT, aIn: 'f32', bIn: bF16 ? 'f16' : 'f32', accum: accum && splits === 1 };
    const pipe = await this.pipeline(plan);
    const grid = [S / MMA.BN, R / MMA.BM, splits];
    const make = (p, dims, res, g, l) => checked(this.device, l, () => {
      const u = uniformWords(this.device, dims, `${l}.dims`);
      return { ...launch(this.device, p, { dims: u, ...res }, g, l), file: 'mma.js', entry: 'main',
        owned: [u] };
    });
    if (splits === 1) return make(pipe, [R, S, INNER, KS], { a, b, c }, grid, label);
    check(part && part.size >= 4 * splits * R * S, `${label}: split-K over ${splits} parts needs ` +
      `a part buffer of ${4 * splits * R * S} bytes`);
    this.addSlabs ??= this.lib.compile(addSlabsShader, 'mma add slabs')
      .then((shader) => this.lib.pipelineOf(shader, 'main'));
    const n4 = (R * S) / 4;
    return Promise.all([
      make(pipe, [R, S, INNER, KS], { a, b, c: part }, grid, label),
      make(await this.addSlabs, [n4, splits, accum ? 1 : 0, 0], { part, out: c },
        grid1d(cdiv(n4, 256)), label),
    ]);
  }
}
