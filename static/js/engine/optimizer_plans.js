// The update dispatches of an Optimizer (optimizer.js), planned once: per window (fp32 state) or
// per 8-bit chunk, the bind group and grid of the update entry point.

import { align } from './gpu.js';
import { MAX_GRID, MIN_BLOCK_ROUNDS, WINDOW_ALIGN } from './optimizer.js';
import { chunks8 } from './optimizer_tables.js';

/** fp32 state: one update dispatch per window of W, G, M, V (and the mirror). */
export function planFp32(opt, wg) {
  return opt.windows.map((win) => {
    const n4 = win.len / 4;
    const groups = Math.ceil(n4 / wg);
    const x = Math.min(groups, MAX_GRID);
    const res = {
      hp: opt.uHyper, cu: opt._chunk({ base: win.base, n4 }), stats: opt.stats,
      w4: opt._range(opt.W, win.base, win.len, 4), g4: opt._range(opt.G, win.base, win.len, 4),
      m4: opt._range(opt.M, win.base, win.len, 4), v4: opt._range(opt.V, win.base, win.len, 4),
    };
    if (opt.f16) res.mirror = opt._range(opt.mirror, win.base, win.len, 2);
    return { group: opt._group(opt.pUpdate, res), grid: [x, Math.ceil(groups / x)] };
  });
}

// 8-bit chunks (optimizer_tables.js chunks8): runs of whole blocks whose W/G window and codes
// window fit one binding each.
export function plan8(opt, bpw, persistent, nwg8) {
  const blockBytes = 2 * opt.plan.blocksize;   // m and v codes of one block
  const chunks = chunks8(opt.plan, opt.windowElems, WINDOW_ALIGN);
  if (chunks.length > 1) opt.notes.push(`8-bit update split into ${chunks.length} dispatches`);
  return chunks.map((c) => {
    const len = align(c.end - c.base, 4);
    const qbase = Math.max(c.qbase, 0);
    const qlen = Math.max(c.qend - qbase, 1);
    const res = {
      hp: opt.uHyper, stats: opt.stats,
      cu: opt._chunk({ base: c.base, b0: c.b0, b1: c.b1, qbase,
        m32: opt.state8.m32, v32: opt.state8.v32 }),
      w4: opt._range(opt.W, c.base, len, 4), g4: opt._range(opt.G, c.base, len, 4),
      codes: { buffer: opt.codes, offset: qbase * blockBytes,
        size: Math.min(qlen * blockBytes, opt.codes.size - qbase * blockBytes) },
      small: opt.small, tables: opt.tables,
    };
    if (opt.f16) res.mirror = opt._range(opt.mirror, c.base, len, 2);
    const rounds = Math.ceil((c.b1 - c.b0) / bpw);
    if (persistent) {
      // Each workgroup loads ~10 KB of tables first: give it at least MIN_BLOCK_ROUNDS rounds.
      const groups = Math.min(nwg8 ?? opt.defaultGroups8(rounds),
        Math.ceil(rounds / MIN_BLOCK_ROUNDS), MAX_GRID);
      return { group: opt._group(opt.pUpdate, res), grid: [groups, 1] };
    }
    const x = Math.min(rounds, MAX_GRID);
    return { group: opt._group(opt.pUpdate, res), grid: [x, Math.ceil(rounds / x)] };
  });
}
