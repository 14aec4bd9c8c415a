// The fp32 matmuls' tile policy (matmul_core.wgsl) and the weight gradients' split-K: which tile
// and how many splits a matmul of a given shape gets. Functions of the shapes only (and of
// whether the adapter has the big tile's workgroup memory, which changes no result), so a given
// model and batch always sums in the same order on every adapter.

import { mmaSplit } from './mma_ops.js';
import { grid1d } from './ops.js';

const cdiv = (a, b) => Math.ceil(a / b);

// matmul_core.wgsl's small tile (entry `main`) runs TG x TG threads on a 4TG x 4TG output tile,
// 4x4 outputs each: TG 16 (64 x 64) from BIG_MATMUL multiply-adds, TG 8 (32 x 32) below, which
// keeps small problems such as `tiny` spread over enough workgroups. From WIDE_MATMUL on, the wide
// tile (entry `main_wide`, 8x8 outputs per thread, BK 8): 64 x 128 outputs (rows x columns) per
// workgroup of 16 x 8 threads, or 128 x 128 per 16 x 16 threads where that makes at least
// WIDE_BIG_TILES tiles (on an H200 the 128 x 128 tile is 5-10% faster there and slower on fewer,
// where a wave of workgroups is left part-empty), and always for weight gradients, whose
// split-K fills the waves. All tiles give the same bits; the tile, and so
// a weight gradient's split, is chosen from the problem size only, so results never depend on
// the adapter. An adapter without the 128 x 128 tile's workgroup memory runs the 64 x 128 one
// over the same splits. Timings: bench/results/step_h200.txt, bench/results/matmul_h200.txt.
const BIG_MATMUL = 2 ** 26;   // R * S * INNER multiply-adds from which TG is 16
const WIDE_MATMUL = 2 ** 28;  // ... and from which the wide tile is used
const WIDE = { WX: 16, WY: 8 };       // matmul_core.wgsl matmul_wide's overrides: 64 x 128
export const WIDE_BIG = { WX: 16, WY: 16 };  // 128 x 128
const WIDE_BIG_TILES = 256;
// matmul_wide's reduction step: a WGSL const there (its steps are written out), so not passed;
// tests/js/shaders.test.mjs holds the two equal.
export const WBK = 8;
// matmul_wide's workgroup memory with WIDE_BIG: 2 slices x WBK x (2 WY + 1 + 2 WX + 1) vec4s of
// the two operands, 16,896 bytes: over WebGPU's default limit of 16 KiB, which most adapters raise.
export const WIDE_BIG_BYTES = 2 * WBK * (2 * WIDE_BIG.WY + 1 + 2 * WIDE_BIG.WX + 1) * 16;

/** Launch shape of matmul_core for an [R, S] output summed over `inner`: entry point, its
 *  overrides, workgroup tile (tile rows x tileS columns); tg = tile / 4, the rows of 4x4 output
 *  groups in a tile (the small tile's threads per side). bigOk: the adapter runs WIDE_BIG;
 *  weightGrad: a weight gradient (split-K). */
export function matmulShape(R, S, inner, bigOk = true, weightGrad = false) {
  if (R * S * inner >= WIDE_MATMUL) {
    const big = bigOk && (weightGrad
      || cdiv(R, 8 * WIDE_BIG.WY) * cdiv(S, 8 * WIDE_BIG.WX) >= WIDE_BIG_TILES);
    const w = big ? WIDE_BIG : WIDE;
    return { tg: 2 * w.WY, tile: 8 * w.WY, tileS: 8 * w.WX, entry: 'main_wide',
      constants: { ...w } };
  }
  const tg = R * S * inner >= BIG_MATMUL ? 16 : 8;
  return { tg, tile: 4 * tg, tileS: 4 * tg, entry: 'main', constants: { TG: tg, BK } };
}

// A software adapter (ctx.software: SwiftShader, llvmpipe) runs every fp32 matmul on
// matmul_core.wgsl's direct kernel instead (entry `main_direct`, no workgroup memory or
// barriers; DIRECT_ROWS x DIRECT_COLS outputs per thread, DIRECT_WG threads a workgroup): on
// SwiftShader it runs tiny's matmuls 3-5x faster than the tiles (bench/results/tiny_swiftshader.txt).
// Same bits as the tiles, over the same splits (weightGradSplit never asks which adapter).
const DIRECT_ROWS = 8;
const DIRECT_COLS = 8;
const DIRECT_WG = 64;

/** How matmul_core runs an [R, S] output summed over `inner`: entry, overrides and workgroup
 *  grid (x, y; a split weight gradient's splits go in z). software: the adapter is a CPU. */
export function matmulLaunch(R, S, inner, { bigOk = true, weightGrad = false, software = false } = {}) {
  if (software) {
    return { entry: 'main_direct', constants: { DWG: DIRECT_WG },
      groups: grid1d(cdiv(cdiv(R, DIRECT_ROWS) * cdiv(S, DIRECT_COLS), DIRECT_WG)) };
  }
  const { tile, tileS, entry, constants } = matmulShape(R, S, inner, bigOk, weightGrad);
  return { entry, constants, groups: [cdiv(S, tileS), cdiv(R, tile)] };
}

// Split-K for weight gradients (dW[N, K] sums over all M = B*T rows), each split at least
// SPLIT_MIN_ROWS rows. The small tiles: enough splits to give the GPU about SPLIT_TARGET
// workgroups. The wide tile: the count s that minimises the time modelled as waves(s) / s x
// (1 + SPLIT_COST s), waves(s) = ceil(tiles x s / WAVE): whole waves of WAVE workgroups (an
// H200's 132 SMs, one 256-thread workgroup each), each split costing ~1% more (its partial sums'
// writes and their reduction); fitted to the 12m and 120m shapes' timings on an H200
// (bench/results/matmul_h200.txt). A function of the shapes only, so a given model and batch
// always sums in the same order on every adapter.
const SPLIT_TARGET = 1024;
const SPLIT_MIN_ROWS = 256;
const WAVE = 132;
const SPLIT_COST = 0.01;
const BK = 16;   // the small tile's reduction step (passed to it); split rows are multiples of it
                // (and so of the wide tile's BK 8)

/** {splits, rows per split, tg, tile} of the weight gradient dW[N, K] over M rows. */
export function weightGradSplit(M, N, K) {
  const { tg, tile, tileS, entry } = matmulShape(N, K, M, true, true);
  const tiles = cdiv(N, tile) * cdiv(K, tileS);
  const most = Math.max(1, Math.floor(M / SPLIT_MIN_ROWS));
  const splits = entry === 'main_wide' ? waveSplits(tiles, most)
    : Math.min(Math.max(1, Math.floor(SPLIT_TARGET / tiles)), most);
  const rows = cdiv(cdiv(M, splits), BK) * BK;
  return { splits: cdiv(M, rows), rows, tg, tile };
}

/** The wide tile's split count in [1, most] for `tiles` output tiles: the wave model above. */
function waveSplits(tiles, most) {
  let splits = 1;
  let best = Infinity;
  for (let s = 1; s <= most; s++) {
    const t = (Math.ceil((tiles * s) / WAVE) / s) * (1 + SPLIT_COST * s);
    if (t < best - 1e-12) { best = t; splits = s; }
  }
  return splits;
}

/** Scratch floats linearBackwardWeight needs for dW[N, K] over M rows (0: no split); mixed:
 *  enough for the mixed-precision kernel's split too. */
export function weightGradPartNumel(M, N, K, mixed = false) {
  const { splits } = weightGradSplit(M, N, K);
  const own = splits > 1 ? splits * N * K : 0;
  const mm = mixed ? mmaSplit(N, K, M) : { fits: false };
  return mm.fits && mm.splits > 1 ? Math.max(own, mm.splits * N * K) : own;
}
