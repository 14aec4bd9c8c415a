// Host-side tables for 12_optimizer.wgsl, built once per run from the layout and the maps:
// the 8-bit block plan, the nearest-code quantization tables, and f32 -> f16 packing for the mirror.
// Pure JS (no GPU), so it runs the same in a page, under Node, and in tests.

export const EXP_RANGE = 24;        // quantization buckets cover |x| in [2^-24, 1] (see buildQuantTables)

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);
const bitsOf = (f) => { F32[0] = f; return U32[0]; };
const fromBits = (u) => { U32[0] = u >>> 0; return F32[0]; };
const roundUp = (n, a) => Math.ceil(n / a) * a;

/**
 * The 8-bit block plan (same rules as server/optim.py block_plan): every tensor is cut into blocks
 * of at most `blocksize` elements (GET /api/optimizer/maps) from its own offset (blocks never
 * straddle tensors). Which tensors keep f32 state is the server's decision, never made here:
 * `f32Tensors` lists their names (layout.optimizer_state.adamw_8bit.f32_tensors, server/optim.py
 * f32_tensors); every other tensor gets 8-bit state (slot = 8-bit block ordinal q), a listed one
 * f32 state (slot = offset in the f32 planes). entries: Uint32Array [4 * nBlocks] of (start,
 * length, slot, flags), flags bit 0 = f32 state. The kernel reads 4 elements per thread: offsets
 * and numels must be multiples of 4 (true whenever n_embd % 4 == 0).
 */
export function buildBlockPlan(layout, { blocksize }, f32Tensors) {
  if (!(blocksize > 0)) {
    throw new Error('8-bit optimizer: the blocksize comes from the server (maps)');
  }
  if (!Array.isArray(f32Tensors)) {
    throw new Error('8-bit optimizer: the tensors that keep f32 state come from the server ' +
      '(layout.optimizer_state.adamw_8bit.f32_tensors, server/optim.py)');
  }
  const keep = new Set(f32Tensors);
  const names = new Set(layout.params.map((p) => p.name));
  const unknown = f32Tensors.filter((name) => !names.has(name));
  if (unknown.length) throw new Error(`8-bit optimizer: f32_tensors names unknown tensors ${unknown.join(', ')}`);
  const rows = [];
  let q = 0;
  let f32 = 0;
  for (const p of layout.params) {
    if (p.offset % 4 || p.numel % 4) {
      throw new Error(`8-bit optimizer: tensor ${p.name} (offset ${p.offset}, numel ${p.numel}) is ` +
        'not a multiple of 4 elements; use a model with n_embd % 4 == 0');
    }
    const is8 = !keep.has(p.name);
    for (let s = 0; s < p.numel; s += blocksize) {
      const len = Math.min(blocksize, p.numel - s);
      rows.push([p.offset + s, len, is8 ? q++ : f32 + s, is8 ? 0 : 1]);
    }
    if (!is8) f32 += roundUp(p.numel, 4);
  }
  const entries = new Uint32Array(rows.length * 4);
  rows.forEach((r, i) => entries.set(r, 4 * i));
  return { entries, nBlocks: rows.length, qBlocks: q, f32Numel: f32, blocksize };
}

/** Sizes (bytes) of the 8-bit state buffers; the same numbers as server/optim.py optimizer_memory. */
export function stateLayout8(plan) {
  const absmaxFloats = roundUp(2 * plan.qBlocks, 4);
  return {
    codesBytes: 2 * plan.blocksize * plan.qBlocks,                   // m and v codes, 1 byte each
    smallFloats: absmaxFloats + 2 * plan.f32Numel,              // absmax pairs, then f32 m, f32 v
    m32: absmaxFloats,
    v32: absmaxFloats + plan.f32Numel,
  };
}

// ---- nearest-code tables

// "Nearest" as bitsandbytes' blockwise quantizer decides it: code j+1 wins over j only when it is
// strictly closer in f32 arithmetic (ties go to the lower code). JS doubles hold these differences
// exactly (both operands are f32 in [-1, 1] and adjacent), so one fround is the f32 result.
function closerToRight(x, lo, hi) {
  return Math.abs(Math.fround(x - hi)) < Math.abs(Math.fround(x - lo));
}

// f32 values <-> integers in the same order (negative floats count down from -0).
const ordOf = (f) => { const u = bitsOf(f); return u & 0x80000000 ? -(u & 0x7fffffff) : u; };
const fromOrd = (k) => (k < 0 ? fromBits(0x80000000 | -k) : fromBits(k));

/** thr[j] = smallest f32 x that rounds to code j+1 or above (thr[255] = +Inf). */
function thresholds(code) {
  const thr = new Float32Array(256);
  for (let j = 0; j < 255; j++) {
    let lo = ordOf(code[j]);       // rounds to j
    let hi = ordOf(code[j + 1]);   // rounds to j+1
    while (hi - lo > 1) {
      const mid = lo + Math.floor((hi - lo) / 2);
      if (closerToRight(fromOrd(mid), code[j], code[j + 1])) hi = mid; else lo = mid;
    }
    thr[j] = fromOrd(hi);
  }
  thr[255] = Infinity;
  return thr;
}

function countAtOrBelow(thr, x) {   // = the code x rounds to
  let lo = 0;
  let hi = 255;                     // thr[255] = Inf is never <= x
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (thr[mid] <= x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/**
 * Bucket table: for every magnitude bucket (see bucket() in the WGSL) and sign, the code of the
 * bucket's smallest value; the kernel adds 1 when x >= thr[base]. Valid only if no bucket holds
 * two thresholds: the smallest mantissa-bit count mb that achieves it is chosen.
 */
function bucketTable(thr, signs) {
  for (let mb = 4; mb <= 8; mb++) {
    const nk = (EXP_RANGE << mb) + 2;
    const bytes = new Uint8Array(roundUp(signs * nk, 4));
    let ok = true;
    for (let s = 0; s < signs && ok; s++) {
      for (let k = 0; k < nk && ok; k++) {
        // magnitudes [loBits, hiBits) as f32 bit patterns; the last bucket also takes |x| > 1.
        const loBits = k === 0 ? 0 : ((k - 1) + ((127 - EXP_RANGE) << mb)) << (23 - mb);
        const hiBits = k === 0 ? (127 - EXP_RANGE) << 23 : loBits + (1 << (23 - mb));
        const hiMag = fromBits(hiBits - 1);
        const loMag = fromBits(loBits);
        const top = k === nk - 1 ? 1e30 : hiMag;   // largest magnitude in the bucket
        const [xmin, xmax] = s === 0 ? [loMag, top] : [-top, -loMag];
        const base = countAtOrBelow(thr, xmin);
        if (countAtOrBelow(thr, xmax) - base > 1) ok = false;
        bytes[s * nk + k] = base;
      }
    }
    if (ok) return { mb, nk, words: new Uint32Array(bytes.buffer) };
  }
  throw new Error('8-bit optimizer: the quantization map is too fine for the bucket table');
}

/**
 * Tables for quant_m / quant_v in 12_optimizer.wgsl from bitsandbytes' dynamic maps (server/optim.py,
 * GET /api/optimizer/maps). m rounds to the nearest signed code with bitsandbytes' sign fix (a
 * negative m never becomes the 0.0 code: thr between the last negative code and 0.0 is moved to 0);
 * v rounds to the nearest unsigned code. Returns {words: Uint32Array, constants: {override: value}}.
 */
export function buildQuantTables(maps) {
  const codeM = Float32Array.from(maps.signed);
  const codeV = Float32Array.from(maps.unsigned);
  for (const c of [codeM, codeV]) {
    if (c.length !== 256) throw new Error('8-bit optimizer: maps must have 256 entries');
    for (let i = 1; i < 256; i++) {
      if (!(c[i] > c[i - 1])) throw new Error('8-bit optimizer: maps must be strictly increasing');
    }
  }
  const thrM = thresholds(codeM);
  const zero = codeM.indexOf(0);
  if (zero < 1) throw new Error('8-bit optimizer: the signed map needs a 0.0 code above a negative one');
  thrM[zero - 1] = 0;   // sign fix
  const thrV = thresholds(codeV);
  const bm = bucketTable(thrM, 2);
  const bv = bucketTable(thrV, 1);
  const words = new Uint32Array(1024 + bm.words.length + bv.words.length);
  words.set(new Uint32Array(codeM.buffer), 0);
  words.set(new Uint32Array(codeV.buffer), 256);
  words.set(new Uint32Array(thrM.buffer), 512);
  words.set(new Uint32Array(thrV.buffer), 768);
  words.set(bm.words, 1024);
  words.set(bv.words, 1024 + bm.words.length);
  return {
    words,
    constants: { EXP_RANGE, MB_M: bm.mb, MB_V: bv.mb },
  };
}

// ---- f16 mirror

/** f32 -> IEEE binary16 bits, round to nearest even (as pack2x16float on the GPUs we target). */
export function f16Bits(f) {
  const x = bitsOf(f);
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 112;                       // f16 biased exponent
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {                              // f16 subnormal (or zero)
    if (e < -10) return sign;
    const m = mant | 0x800000;
    const shift = 14 - e;
    let h = m >>> shift;
    const rem = m & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && (h & 1))) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++;   // a carry rolls into the exponent
  return sign | h;
}

/** Weights f32 [n] -> the mirror's u32 [n/2] (element 2k in the low half of word k). */
export function packHalf2(w) {
  const out = new Uint32Array(Math.ceil(w.length / 2));
  for (let k = 0; k < out.length; k++) {
    out[k] = (f16Bits(w[2 * k]) | (2 * k + 1 < w.length ? f16Bits(w[2 * k + 1]) << 16 : 0)) >>> 0;
  }
  return out;
}

/**
 * The 8-bit update's dispatches: runs of whole blocks of `plan` (buildBlockPlan) whose W/G
 * window (at most windowElems elements from a multiple of `align`) and codes window (m and v
 * codes of its 8-bit blocks, 2 * blocksize bytes each) each fit one binding.
 * -> [{b0, b1 (block range), base (element window start), end, qbase, qend (8-bit slots; qbase
 * -1 when none)}].
 */
export function chunks8(plan, windowElems, align) {
  const e = plan.entries;
  const maxCodesBlocks = Math.floor(windowElems * 4 / (2 * plan.blocksize));
  const chunks = [];
  let cur = null;
  for (let b = 0; b < plan.nBlocks; b++) {
    const start = e[4 * b];
    const end = start + e[4 * b + 1];
    const is8 = (e[4 * b + 3] & 1) === 0;
    const slot = e[4 * b + 2];
    if (cur) {
      const fits = end - cur.base <= windowElems &&
        (!is8 || cur.qbase < 0 || slot + 1 - cur.qbase <= maxCodesBlocks);
      if (!fits) cur = null;
    }
    if (!cur) {
      cur = { b0: b, b1: b, base: Math.floor(start / align) * align, end: start, qbase: -1, qend: 0 };
      chunks.push(cur);
    }
    cur.b1 = b + 1;
    cur.end = Math.max(cur.end, end);
    if (is8) {
      if (cur.qbase < 0) cur.qbase = slot;
      cur.qend = slot + 1;
    }
  }
  return chunks;
}

/**
 * Everything the 8-bit update needs from the server's layout and maps, checked against the
 * kernel's block size: {plan (buildBlockPlan), quant (buildQuantTables), state8 (stateLayout8),
 * tables: Uint32Array (the quantization tables, then the block table: the `tables` binding)}.
 */
export function prepare8(layout, maps, blockElems) {
  if (!maps) throw new Error('8-bit optimizer needs the quantization maps (GET /api/optimizer/maps)');
  if (maps.blocksize !== blockElems) {
    throw new Error(`8-bit optimizer: the kernel runs blocks of ${blockElems} elements; the ` +
      `server's blocksize is ${maps.blocksize}`);
  }
  // Which tensors keep f32 state: the server's list (server/optim.py f32_tensors), sent in the
  // layout's optimizer_state; the engine never decides it.
  const served = layout.optimizer_state?.adamw_8bit;
  const plan = buildBlockPlan(layout, maps, served?.f32_tensors);
  if (served.q_blocks !== plan.qBlocks || served.f32_numel !== plan.f32Numel) {
    throw new Error(`8-bit optimizer: ${plan.qBlocks} 8-bit blocks and ${plan.f32Numel} f32 ` +
      `elements here, ${served.q_blocks} and ${served.f32_numel} in the server's plan ` +
      '(server/optim.py block_plan)');
  }
  const quant = buildQuantTables(maps);
  const tables = new Uint32Array(quant.words.length + plan.entries.length);
  tables.set(quant.words, 0);
  tables.set(plan.entries, quant.words.length);
  return { plan, quant, state8: stateLayout8(plan), tables };
}
