// Where an Optimizer's dispatches go (optimizer.js builds their uniforms, bind groups and op
// records from these): the element windows of the mega-buffer, each window's grids, and the
// update's dispatches per window (fp32 state) or per 8-bit chunk. Functions of plain numbers
// (the layout's sizes, the device's binding limit, the tuning), planned once.

import { align } from './gpu.js';
import { chunks8 } from './optimizer_tables.js';

export const MAX_GRID = 65535;          // maxComputeWorkgroupsPerDimension (WebGPU default and minimum)
export const WINDOW_ALIGN = 256;        // elements: keeps every sub-range offset 256-byte aligned
export const MIN_BLOCK_ROUNDS = 16;     // 8-bit: blocks per group of 64 threads before its tables pay off
// 8-bit persistent grid on a software adapter: a CPU runs a handful of workgroups at a time and
// each loads ~10 KB of tables at CPU speed, so a few workgroups with many rounds each are fastest.
const SOFTWARE_GROUPS = 4;

/** A grid of `groups` workgroups: [x, y] with x <= MAX_GRID. */
export function grid2d(groups) {
  const x = Math.min(Math.max(groups, 1), MAX_GRID);
  return [x, Math.ceil(Math.max(groups, 1) / x)];
}

/** Element windows [base, base + len) over [0, n), each at most windowElems (one binding). */
export function planWindows(n, windowElems) {
  const windows = [];
  for (let base = 0; base < n; base += windowElems) {
    windows.push({ base, len: Math.min(windowElems, n - base) });
  }
  return windows;
}

/** One thread per vec4 of a window of `len` elements, `wg` threads a workgroup: the grid of
 *  the fp32 update and of the loss scale's element passes. */
export const elementGrid = (len, wg) => grid2d(Math.ceil(len / 4 / wg));

/** fp32 state: one update dispatch per window of W, G, M, V (and the mirror):
 *  [{base, len, n4, grid}]. */
export function planFp32(windows, wg) {
  return windows.map(({ base, len }) => ({ base, len, n4: len / 4, grid: elementGrid(len, wg) }));
}

/** 8-bit persistent workgroups for a chunk of `rounds` rounds of bpw blocks. The grid never
 *  changes a result bit (each block is updated by one group of 64 threads in the same way,
 *  whichever workgroup takes it), only the speed, so the default follows the adapter and the
 *  problem, not one GPU's core count: as many workgroups as the chunk fills with at least
 *  MIN_BLOCK_ROUNDS rounds each (the tables each one loads then pay off), and on a software
 *  adapter at most SOFTWARE_GROUPS. bench/bench_optimizer.mjs --tune times other grids. */
export function defaultGroups8(rounds, software) {
  const filled = Math.ceil(rounds / MIN_BLOCK_ROUNDS);
  return software ? Math.min(SOFTWARE_GROUPS, filled) : filled;
}

/**
 * 8-bit state: one update dispatch per chunk (optimizer_tables.js chunks8: runs of whole blocks
 * whose W/G window and codes window fit one binding each) of the 8-bit plan `plan` (prepare8).
 * -> {dispatches: [{base, len, b0, b1, qbase, codesOffset, codesSize, grid}], notes}; codes
 * offsets in bytes into a codes buffer of `codesBytes`.
 */
export function plan8(plan, { windowElems, codesBytes, bpw, persistent, nwg8, software }) {
  const blockBytes = 2 * plan.blocksize;   // m and v codes of one block
  const chunks = chunks8(plan, windowElems, WINDOW_ALIGN);
  const notes = chunks.length > 1 ? [`8-bit update split into ${chunks.length} dispatches`] : [];
  const dispatches = chunks.map((c) => {
    const qbase = Math.max(c.qbase, 0);
    const qlen = Math.max(c.qend - qbase, 1);
    const rounds = Math.ceil((c.b1 - c.b0) / bpw);
    // Each persistent workgroup loads ~10 KB of tables first: at least MIN_BLOCK_ROUNDS rounds.
    const grid = persistent ? [Math.min(nwg8 ?? defaultGroups8(rounds, software),
      Math.ceil(rounds / MIN_BLOCK_ROUNDS), MAX_GRID), 1] : grid2d(rounds);
    return { base: c.base, len: align(c.end - c.base, 4), b0: c.b0, b1: c.b1, qbase,
      codesOffset: qbase * blockBytes,
      codesSize: Math.min(qlen * blockBytes, codesBytes - qbase * blockBytes), grid };
  });
  return { dispatches, notes };
}
