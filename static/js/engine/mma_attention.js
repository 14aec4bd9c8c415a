// WGSL of causal attention on the GPU's matrix units for mixed-precision runs (mma.js's f16
// subgroup matrices, f32 accumulation), FlashAttention-2 style: the T x T scores never reach
// memory. kernels.js runs these where the adapter has the features (mixedSupport) and the shape
// fits (mmaAttentionFits); the fp32 kernels (05_attention, 10_attention_backward) everywhere else.
//
// What is f16 and what is f32: q, k, v and dO are rounded to f16 as they are staged, and so are
// P (forward, dv) and dS (dq, dk) as operands of their products; every product sums in f32, and
// the scores, the softmax with its statistics (max, sum, logsumexp), the causal mask and delta
// stay f32, as FlashAttention does on tensor cores.
//
// A workgroup is 4 subgroups of 32 lanes and owns a block of 64 rows of one (batch, head): the
// forward and dq 64 queries, walking the key blocks 0 .. their own; dk/dv 64 keys, walking the
// queries from their own on, 32 at a time. Subgroup s owns rows 16 s .. 16 s + 15. The products
// are subgroup-matrix tiles of 16 x 16; the elementwise work between them (softmax, P, dS) is
// done by lanes on the score tiles stored to workgroup memory: lane i takes row i / 2 of its
// subgroup's 16 and half i % 2 of the columns. The forward keeps its output rows in those lanes'
// registers (its online-softmax rescaling needs them per element), adding each block's P V tile
// through workgroup memory; dq, dk and dv accumulate in subgroup matrices (they need no rescaling)
// and store them straight to dqkv. Every sum runs in a fixed order: results are bit-identical run
// to run.
//
// The backward takes delta = dO . y from 10_attention_backward's attention_backward_delta (f32).
// Where the model's dS buffer is bound (kernels.js attentionDsNumel), dk/dv also store scale * dS
// there in f16 and dq is then a matmul of those rows with k (attentionDqFromDsShader); else dq
// recomputes the scores and dP (attentionDqShader): the same dS, the same dq bits either way.
//
// Bindings (the fp32 kernels' names and layouts; dims: {B, T, H, D, C, scale}):
//   forward: qkv [B, T, 3C] read, y [B, T, C] =, lse [B, H, T] =
//   dq:      qkv, dy [B, T, C], lse, delta [B, H, T] read; dqkv [B, T, 3C]: the q third =
//   dkdv:    the same; dqkv's k and v thirds =; with storeDs: ds [B, H, T, T] f16 = scale * dS
//   dq from dS: qkv, ds read; dqkv's q third =
// Dispatch: B * H * T / 64 workgroups (grid1d: 2-D past 65535).

import { matrixLoad, matrixStore } from './mma.js';

const ROWS = 64;          // rows of a workgroup's block (queries, or keys for dk/dv)
const KEYS = 64;          // key block of the forward and dq
const QCHUNK = 32;        // query chunk of dk/dv
const THREADS = 128;      // 4 subgroups of 32
const PAD_H = 8;          // row padding of the f16 tiles, in halves
const PAD_F = 4;          // row padding of the f32 score tiles, in floats

/** Whether causal attention of T rows and head dim D runs on these kernels: whole 64-row blocks,
 *  head dims of whole 16-wide tiles up to 64 (the lanes' registers and workgroup memory are
 *  sized for that). */
export function mmaAttentionFits(T, D) {
  return T % ROWS === 0 && D % 16 === 0 && D >= 16 && D <= 64;
}

// Each kernel's workgroup arrays at head dim D: [name, element type, elements, what it holds].
// The shaders declare exactly these (declare) and the support check sums them (mmaAttentionBytes).
const ARRAYS = {
  forward: (D) => [
    ['sk', 'f16', ROWS * (D + PAD_H), 'q (first), then each key block\'s k'],
    ['sv', 'f16', ROWS * (D + PAD_H), 'the key block\'s v'],
    ['ss', 'f32', ROWS * (KEYS + PAD_F), 'scores, then P v, [row][key or dim]'],
    ['sp', 'f16', ROWS * (KEYS + PAD_H), 'P [row][key]'],
    ['sx', 'f32', THREADS, 'lane pairs\' partial row max, then row sums']],
  dq: (D) => [
    ['sk', 'f16', ROWS * (D + PAD_H), 'q, dO (first), then each block\'s k'],
    ['sv', 'f16', ROWS * (D + PAD_H), 'the key block\'s v'],
    ['ss', 'f32', ROWS * (KEYS + PAD_F), 'scores, then dO v^T, [query][key]'],
    ['sp', 'f16', ROWS * (KEYS + PAD_H), 'scale * dS [query][key]']],
  dkdv: (D) => [
    ['skv', 'f16', ROWS * (D + PAD_H), 'the block\'s k, then its v (once)'],
    ['sq', 'f16', QCHUNK * (D + PAD_H), 'the chunk\'s q'],
    ['sdo', 'f16', QCHUNK * (D + PAD_H), 'the chunk\'s dO'],
    ['ss', 'f32', ROWS * (QCHUNK + PAD_F), 'S^T, then dP^T [key][query]'],
    ['sp', 'f16', ROWS * (QCHUNK + PAD_H), 'P^T [key][query]'],
    ['sd', 'f16', ROWS * (QCHUNK + PAD_H), 'scale * dS^T [key][query]'],
    ['sl', 'f32', QCHUNK, 'the chunk\'s lse'],
    ['sdel', 'f32', QCHUNK, 'the chunk\'s delta']],
  dqFromDs: (D) => [['sk', 'f16', KEYS * (D + PAD_H), 'the key block\'s k']],
};

const declare = (arrays) => arrays.map(([name, type, n, what]) =>
  `var<workgroup> ${name}: array<${type}, ${n}>;   // ${what}`).join('\n');

/** Workgroup memory of each kernel at head dim D, in bytes. */
export function mmaAttentionBytes(D) {
  return Object.fromEntries(Object.entries(ARRAYS).map(([kernel, arrays]) =>
    [kernel, arrays(D).reduce((a, [, type, n]) => a + (type === 'f16' ? 2 : 4) * n, 0)]));
}

/** The matrix load and store builtins in `syntax`'s spelling (mma.js); stores row-major. */
const builtins = (syntax) => ({
  ld: (T, ptr, off, cm, stride) => matrixLoad(syntax, T, ptr, off, cm, stride),
  st: (ptr, off, v, stride) => matrixStore(syntax, ptr, off, v, false, stride),
});
const rep = (n, f) => Array.from({ length: n }, (_, i) => f(i)).join('\n  ');

const L = 'subgroup_matrix_left<f16, 16, 16>';
const R = 'subgroup_matrix_right<f16, 16, 16>';
const C = 'subgroup_matrix_result<f32, 16, 16>';

function header(D) {
  return `enable f16;
enable chromium_experimental_subgroup_matrix;
// A subgroup's rows (local_invocation_index / 32) are not workgroup-uniform, but each subgroup's
// own matrix operations are: the uniformity analysis cannot see that.
diagnostic(off, chromium.subgroup_matrix_uniformity);

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> dims: Dims;

const HD = ${D}u;           // head dim
const HV = ${D / 4}u;       // vec4s per head row
const LDH = ${D + PAD_H}u;  // f16 tile row stride`;
}

// The entry point's opening: the workgroup's (batch, head, block), blocks in reverse order where
// the longest walks are the last blocks' (forward, dq), in order where they are the first's
// (dk/dv), so long ones start first; whole workgroups return early (barriers stay uniform). Lane
// `lane` of subgroup `sg` takes row r of the block and half `half` of its columns.
function entry(reverse) {
  return `@compute @workgroup_size(${THREADS})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let nb = dims.T / ${ROWS}u;
  let bh = dims.B * dims.H;
  let w = wg.x + wg.y * nwg.x;
  if (w >= bh * nb) { return; }
  let b = (w % bh) / dims.H;
  let h = w % dims.H;
  let blk = ${reverse ? 'nb - 1u - w / bh' : 'w / bh'};
  let row3 = 3u * dims.C;
  let qbase = b * dims.T * row3 + h * dims.D;   // element of q in row 0 of this (batch, head)
  let kbase = qbase + dims.C;
  let vbase = qbase + 2u * dims.C;
  let obase = b * dims.T * dims.C + h * dims.D;  // in y and dy
  let hrow = (b * dims.H + h) * dims.T;          // in lse and delta
  let sg = tid / 32u;
  let lane = tid % 32u;
  let half = lane % 2u;
  let r = 16u * sg + lane / 2u;`;
}

// Staging a head's rows: row t at element base + t * stride of the vec4 array src; the thread's
// vec4 i of rows r0 .. (HV vec4s a row) goes, rounded to f16, to dst[(i / HV) * LDH + 4 (i % HV)].
const rowVec4 = (src, base, stride, r0, i) =>
  `${src}[(${base} + (${r0} + ${i} / HV) * ${stride}) / 4u + ${i} % HV]`;
const slotOf = (i) => `let o = (${i} / HV) * LDH + 4u * (${i} % HV);`;
const halves = (dst) => `${dst}[o] = x.x; ${dst}[o + 1u] = x.y; ${dst}[o + 2u] = x.z; ${dst}[o + 3u] = x.w;`;

// Rows r0 .. r0 + rows - 1 into dst[rows][LDH], in one loop (loads then stores).
function stage(dst, src, base, stride, r0, rows) {
  return `for (var i = tid; i < ${rows}u * HV; i += ${THREADS}u) {
    let x = vec4<f16>(${rowVec4(src, base, stride, r0, 'i')});
    ${slotOf('i')}
    ${halves(dst)}
  }`;
}

/** The same copy in two halves, so that a block's global loads are in flight while the block
 *  before it computes (as mma.js prefetches its slices): `fetch(r0)` loads this thread's vec4s of
 *  rows r0 .. into registers, `put` rounds them into dst. */
function stager(name, dst, src, base, stride, rows, D) {
  const n = (rows * D) / 4 / THREADS;   // vec4s per thread (whole: rows * D is a multiple of 512)
  const at = (i) => `(tid + ${i * THREADS}u)`;
  return {
    regs: rep(n, (i) => `var ${name}${i}: vec4<f32>;`),
    fetch: (r0) => rep(n, (i) => `${name}${i} = ${rowVec4(src, base, stride, r0, at(i))};`),
    put: rep(n, (i) => `{ ${slotOf(at(i))} let x = vec4<f16>(${name}${i});
    ${halves(dst)} }`),
  };
}

/** The opening of a walk over blocks whose operands (stagers) are loaded a block ahead: the
 *  registers and the first block's loads, then `for (head)` with, per block, `pre`, a barrier
 *  (the last block's reads of workgroup memory are done), the block put into workgroup memory
 *  (and `alsoPut`), a barrier, and the next block's loads issued where `more`, to land while the
 *  body the caller appends computes. The caller closes the loop. */
function walk(stagers, { head, first, next, more, pre = '', alsoPut = '' }) {
  const each = (f, sep) => stagers.map(f).join(sep);
  return `${each((x) => x.regs, '\n  ')}
  ${each((x) => x.fetch(first), '\n  ')}
  for (${head}) {
    ${pre}
    workgroupBarrier();
    ${each((x) => x.put, '\n    ')}
    ${alsoPut}
    workgroupBarrier();
    if (${more}) {
      ${each((x) => x.fetch(next), '\n      ')}
    }`;
}

/** Lines loading this subgroup's 16 rows of `buf` ([rows][LDH] f16) as left operands
 *  `name`0 .. (one per 16 head dims). */
const rowMatrices = (ld, name, buf, D) => rep(D / 16, (d) =>
  `let ${name}${d} = ${ld(L, `&${buf}`, `16u * sg * LDH + ${16 * d}u`, false, 'LDH')};`);

/** Score-like tiles of this subgroup's 16 rows against `cols` rows of `src` ([rows][LDH] f16,
 *  read transposed as the right operand): sum over the head dims of left`d` src^T, each 16-wide
 *  tile stored to `ss` ([row][column], row stride lds). */
const scoreTiles = ({ ld, st }, left, src, cols, lds, D) => rep(cols / 16, (j) => `{ var s = ${C}();
    ${rep(D / 16, (d) => `s = subgroupMatrixMultiplyAccumulate(${left}${d}, ${ld(R, `&${src}`, `${16 * j}u * LDH + ${16 * d}u`, true, 'LDH')}, s);`)}
    ${st('&ss', `16u * sg * ${lds}u + ${16 * j}u`, 's', `${lds}u`)} }`);

/** acc += this subgroup's 16 rows of `left` ([row][k] f16, row stride ldp) times head dims
 *  16 dj .. of `right` ([k][LDH] f16), over k in 16-wide steps, nk of them. */
const tileProduct = ({ ld }, acc, left, ldp, right, nk, dj) => rep(nk, (kk) =>
  `${acc} = subgroupMatrixMultiplyAccumulate(${ld(L, `&${left}`, `16u * sg * ${ldp}u + ${16 * kk}u`, false, `${ldp}u`)}, ${ld(R, `&${right}`, `${16 * kk}u * LDH + ${16 * dj}u`, false, 'LDH')}, ${acc});`);

/** WGSL of the forward: y, lse. */
export function attentionForwardShader(D, syntax = 'template') {
  const ND = D / 16;
  const OH = D / 2;         // output dims per lane
  const LDS = KEYS + PAD_F;
  const LDP = KEYS + PAD_H;
  const b = builtins(syntax);
  const K = stager('kr', 'sk', 'qkv', 'kbase', 'row3', KEYS, D);
  const V = stager('vr', 'sv', 'qkv', 'vbase', 'row3', KEYS, D);
  const pv = rep(ND, (dj) => `{ var a = ${C}();
    ${tileProduct(b, 'a', 'sp', LDP, 'sv', KEYS / 16, dj)}
    ${b.st('&ss', `16u * sg * ${LDS}u + ${16 * dj}u`, 'a', `${LDS}u`)} }`);
  return `${header(D)}
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;   // [B, T, 3C]
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;   // [B, T, C]
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;    // [B, H, T]

${declare(ARRAYS.forward(D))}

${entry(true)}
  let q0 = blk * ${ROWS}u;
  let t = q0 + r;   // this lane's query
  ${stage('sk', 'qkv', 'qbase', 'row3', 'q0', ROWS)}
  workgroupBarrier();
  ${rowMatrices(b.ld, 'qm', 'sk', D)}
  var m = -3.0e38;     // running row max (scaled scores)
  var l = 0.0;         // running sum of this lane's columns
  ${rep(OH, (i) => `var o${i} = 0.0;`)}
  ${walk([K, V], { head: 'var kb = 0u; kb <= blk; kb++', pre: `let k0 = kb * ${KEYS}u;`,
    first: '0u', next: `k0 + ${KEYS}u`, more: 'kb < blk' })}
    ${scoreTiles(b, 'qm', 'sk', KEYS, LDS, D)}
    workgroupBarrier();
    // This lane's 32 keys k0 + 32 half + i: scaled, masked past the query.
    let sr = r * ${LDS}u + 32u * half;
    let kc = k0 + 32u * half;
    var mx = -3.0e38;
    ${rep(32, (i) => `let s${i} = select(ss[sr + ${i}u] * dims.scale, -3.0e38, kc + ${i}u > t); mx = max(mx, s${i});`)}
    sx[tid] = mx;
    workgroupBarrier();
    let mnew = max(m, max(mx, sx[tid ^ 1u]));
    let corr = exp(m - mnew);
    m = mnew;
    let pr = r * ${LDP}u + 32u * half;
    var ps = 0.0;
    ${rep(32, (i) => `{ let p = exp(s${i} - m); ps += p; sp[pr + ${i}u] = f16(p); }`)}
    l = fma(l, corr, ps);
    ${rep(OH, (i) => `o${i} *= corr;`)}
    workgroupBarrier();
    ${pv}
    workgroupBarrier();
    let orow = r * ${LDS}u + ${OH}u * half;
    ${rep(OH, (i) => `o${i} += ss[orow + ${i}u];`)}
  }
  workgroupBarrier();
  sx[tid] = l;
  workgroupBarrier();
  let lt = l + sx[tid ^ 1u];
  let inv = 1.0 / lt;
  let yo = (obase + t * dims.C + ${OH}u * half) / 4u;
  ${rep(OH / 4, (i) => `y[yo + ${i}u] = vec4<f32>(o${4 * i}, o${4 * i + 1}, o${4 * i + 2}, o${4 * i + 3}) * inv;`)}
  if (half == 0u) { lse[hrow + t] = m + log(lt); }
}
`;
}

/** WGSL of dq (the q third of dqkv) = scale * sum over keys of dS k. */
export function attentionDqShader(D, syntax = 'template') {
  const ND = D / 16;
  const LDS = KEYS + PAD_F;
  const LDP = KEYS + PAD_H;
  const b = builtins(syntax);
  const K = stager('kr', 'sk', 'qkv', 'kbase', 'row3', KEYS, D);
  const V = stager('vr', 'sv', 'qkv', 'vbase', 'row3', KEYS, D);
  return `${header(D)}
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;   // [B, T, 3C]
@group(0) @binding(2) var<storage, read> dy: array<vec4<f32>>;    // [B, T, C]
@group(0) @binding(3) var<storage, read> lse: array<f32>;         // [B, H, T]
@group(0) @binding(4) var<storage, read> delta: array<f32>;       // [B, H, T]
@group(0) @binding(5) var<storage, read_write> dqkv: array<f32>;  // [B, T, 3C]

${declare(ARRAYS.dq(D))}

${entry(true)}
  let q0 = blk * ${ROWS}u;
  let t = q0 + r;   // this lane's query
  let lse_t = lse[hrow + t];
  let delta_t = delta[hrow + t];
  ${stage('sk', 'qkv', 'qbase', 'row3', 'q0', ROWS)}
  ${stage('sv', 'dy', 'obase', 'dims.C', 'q0', ROWS)}
  workgroupBarrier();
  ${rowMatrices(b.ld, 'qm', 'sk', D)}
  ${rowMatrices(b.ld, 'gm', 'sv', D)}
  ${rep(ND, (d) => `var dq${d} = ${C}();`)}
  ${walk([K, V], { head: 'var kb = 0u; kb <= blk; kb++', pre: `let k0 = kb * ${KEYS}u;`,
    first: '0u', next: `k0 + ${KEYS}u`, more: 'kb < blk' })}
    ${scoreTiles(b, 'qm', 'sk', KEYS, LDS, D)}   // S
    workgroupBarrier();
    let sr = r * ${LDS}u + 32u * half;
    let kc = k0 + 32u * half;
    ${rep(32, (i) => `let p${i} = select(exp(ss[sr + ${i}u] * dims.scale - lse_t), 0.0, kc + ${i}u > t);`)}
    workgroupBarrier();   // the scores are read: ss takes dO v^T
    ${scoreTiles(b, 'gm', 'sv', KEYS, LDS, D)}   // dP
    workgroupBarrier();
    let pr = r * ${LDP}u + 32u * half;
    ${rep(32, (i) => `sp[pr + ${i}u] = f16(p${i} * (ss[sr + ${i}u] - delta_t) * dims.scale);`)}
    workgroupBarrier();
    ${rep(ND, (dj) => tileProduct(b, `dq${dj}`, 'sp', LDP, 'sk', KEYS / 16, dj))}
  }
  let out = qbase + (q0 + 16u * sg) * row3;
  ${rep(ND, (d) => b.st('&dqkv', `out + ${16 * d}u`, `dq${d}`, 'row3'))}
}
`;
}

/** WGSL of dk = scale * sum over queries of dS^T q and dv = sum over queries of P^T dO (the k and
 *  v thirds of dqkv). */
export function attentionDkdvShader(D, syntax = 'template', storeDs = false) {
  const ND = D / 16;
  const NJ = QCHUNK / 16;
  const LDS = QCHUNK + PAD_F;
  const LDP = QCHUNK + PAD_H;
  const b = builtins(syntax);
  const Q = stager('qr', 'sq', 'qkv', 'qbase', 'row3', QCHUNK, D);
  const G = stager('gr', 'sdo', 'dy', 'obase', 'dims.C', QCHUNK, D);
  const acc = (name, left, right) => rep(ND, (dj) => tileProduct(b, `${name}${dj}`, left, LDP, right, NJ, dj));
  const n = QCHUNK / 2;     // queries per lane
  return `${header(D)}
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;   // [B, T, 3C]
@group(0) @binding(2) var<storage, read> dy: array<vec4<f32>>;    // [B, T, C]
@group(0) @binding(3) var<storage, read> lse: array<f32>;         // [B, H, T]
@group(0) @binding(4) var<storage, read> delta: array<f32>;       // [B, H, T]
@group(0) @binding(5) var<storage, read_write> dqkv: array<f32>;  // [B, T, 3C]
${storeDs ? '@group(0) @binding(6) var<storage, read_write> ds: array<f16>;  // [B, H, T, T]: scale * dS' : ''}

${declare(ARRAYS.dkdv(D))}

${entry(false)}
  let k0 = blk * ${ROWS}u;
  let key = k0 + r;   // this lane's key
  ${stage('skv', 'qkv', 'kbase', 'row3', 'k0', ROWS)}
  workgroupBarrier();
  ${rowMatrices(b.ld, 'km', 'skv', D)}
  workgroupBarrier();
  ${stage('skv', 'qkv', 'vbase', 'row3', 'k0', ROWS)}
  workgroupBarrier();
  ${rowMatrices(b.ld, 'vm', 'skv', D)}
  ${rep(ND, (d) => `var dk${d} = ${C}();`)}
  ${rep(ND, (d) => `var dv${d} = ${C}();`)}
  ${walk([Q, G], { head: `var c0 = k0; c0 < dims.T; c0 += ${QCHUNK}u`, first: 'k0',
    next: `c0 + ${QCHUNK}u`, more: `c0 + ${QCHUNK}u < dims.T`,
    alsoPut: `if (tid < ${QCHUNK}u) { sl[tid] = lse[hrow + c0 + tid]; }
    else if (tid < ${2 * QCHUNK}u) { sdel[tid - ${QCHUNK}u] = delta[hrow + c0 + tid - ${QCHUNK}u]; }` })}
    ${scoreTiles(b, 'km', 'sq', QCHUNK, LDS, D)}   // S^T
    workgroupBarrier();
    // This lane's queries c0 + ${n} half + i: P, zero where the query is before the key.
    let sr = r * ${LDS}u + ${n}u * half;
    let qc = ${n}u * half;
    ${rep(n, (i) => `let p${i} = select(exp(ss[sr + ${i}u] * dims.scale - sl[qc + ${i}u]), 0.0, c0 + qc + ${i}u < key);`)}
    workgroupBarrier();   // the scores are read: ss takes dP^T
    ${scoreTiles(b, 'vm', 'sdo', QCHUNK, LDS, D)}   // dP^T
    workgroupBarrier();
    let pr = r * ${LDP}u + qc;
    ${rep(n, (i) => `sp[pr + ${i}u] = f16(p${i}); sd[pr + ${i}u] = f16(p${i} * (ss[sr + ${i}u] - sdel[qc + ${i}u]) * dims.scale);`)}
    workgroupBarrier();
    ${acc('dv', 'sp', 'sdo')}
    ${acc('dk', 'sd', 'sq')}
    ${storeDs ? rep(NJ, (kk) => matrixStore(syntax, '&ds', `(hrow + c0 + ${16 * kk}u) * dims.T + k0 + 16u * sg`,
    b.ld(L, '&sd', `16u * sg * ${LDP}u + ${16 * kk}u`, false, `${LDP}u`), true, 'dims.T')) : ''}
  }
  let out = qbase + (k0 + 16u * sg) * row3;
  ${rep(ND, (d) => b.st('&dqkv', `out + dims.C + ${16 * d}u`, `dk${d}`, 'row3'))}
  ${rep(ND, (d) => b.st('&dqkv', `out + 2u * dims.C + ${16 * d}u`, `dv${d}`, 'row3'))}
}
`;
}

/** WGSL of dq (the q third of dqkv) = sum over keys of (scale * dS) k, reading the scale * dS that
 *  dk/dv stored (attentionDkdvShader with storeDs: ds [B, H, T, T] f16, the causal blocks only)
 *  instead of recomputing the scores: a matmul of dS's rows, read straight from memory as matrix
 *  operands, with each key block of k. */
export function attentionDqFromDsShader(D, syntax = 'template') {
  const ND = D / 16;
  const b = builtins(syntax);
  const K = stager('kr', 'sk', 'qkv', 'kbase', 'row3', KEYS, D);
  return `${header(D)}
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;   // [B, T, 3C]
@group(0) @binding(2) var<storage, read> ds: array<f16>;          // [B, H, T, T]
@group(0) @binding(3) var<storage, read_write> dqkv: array<f32>;  // [B, T, 3C]

${declare(ARRAYS.dqFromDs(D))}

${entry(true)}
  let q0 = blk * ${ROWS}u;
  let dsrow = (hrow + q0 + 16u * sg) * dims.T;   // this subgroup's first row of dS
  ${rep(ND, (d) => `var dq${d} = ${C}();`)}
  ${walk([K], { head: 'var kb = 0u; kb <= blk; kb++', pre: `let k0 = kb * ${KEYS}u;`,
    first: '0u', next: `k0 + ${KEYS}u`, more: 'kb < blk' })}
    ${rep(KEYS / 16, (kk) => `{ let g = ${b.ld(L, '&ds', `dsrow + k0 + ${16 * kk}u`, false, 'dims.T')};
    ${rep(ND, (dj) => `dq${dj} = subgroupMatrixMultiplyAccumulate(g, ${b.ld(R, '&sk', `${16 * kk}u * LDH + ${16 * dj}u`, false, 'LDH')}, dq${dj});`)} }`)}
  }
  let out = qbase + (q0 + 16u * sg) * row3;
  ${rep(ND, (d) => b.st('&dqkv', `out + ${16 * d}u`, `dq${d}`, 'row3'))}
}
`;
}
