// WGSL of the mixed-precision matmul: C = A B with f16 operands and f32 accumulation on the
// GPU's matrix units, through `chromium_experimental_subgroup_matrix` (Vulkan:
// SPV_KHR_cooperative_matrix; Metal: simdgroup matrices). kernels.js launches it for the linears
// of a mixed-precision model where the adapter has f16 subgroup matrices (mixedSupport); the fp32
// kernels (shaders/lib/matmul_core.wgsl) stay for everything else. bench/bench_matmul_f16.mjs
// measures its variants. The source is generated (not WGSL overrides) so that every sub-tile is
// a named variable and every loop over them is unrolled, as tensor-core GEMMs are written.
//
// GEMM terms: C[M, N] (+)= sum_k A(m, k) B(k, n), row-major C. A is stored [M, K] (aT 0) or
// [K, M] (aT 1); B is stored [K, N] (bT 0) or [N, K] (bT 1). The model's matmuls map to it as
//   forward      y  = x W^T : A = x  [M, K]        aT 0, B = W  [N, K]         bT 1
//   input grad   dx = dy W  : A = dy [M, N]        aT 0, B = W  [N, K] as K x N bT 0
//   weight grad  dW = dy^T x: A = dy [rows, N]     aT 1, B = x  [rows, K]      bT 0
//
// One workgroup computes a BM x BN block of C: SGM x SGN subgroups of 32 lanes, each holding
// TM x TN accumulators of 16 x 16. Each BK-deep slice of A and B is read from storage in vectors
// (f32 x4, or f16 x8 as a vec4<u32>), rounded to f16 and written to workgroup memory in the
// layout its global rows have (rows padded by PAD halves); the fragments are read from there with
// subgroupMatrixLoad, row- or column-major as the slice was stored. NBUF 1: one slice buffer, the
// next slice prefetched into registers during the math; NBUF 2: two buffers, one barrier a slice.
// Split-K: workgroup z sums K rows [z KS, (z + 1) KS) into its own M x N slab of C (the caller
// adds the slabs: kernels.js addPartials, 11_linear_backward.wgsl add_partials). accum: C +=
// A B (the accumulators start from C). Operand inputs (aIn, bIn; `input` sets both): 'f32', or
// 'f16' packed two to a u32 (the optimizer's f16 weight mirror).

/** The tile the engine uses (bench/results/matmul_f16_h200.txt: the fastest on every 12m and
 *  120m shape of an H200): 128 x 128 blocks of 2 x 2 subgroups with 4 x 4 tiles of 16 x 16 each,
 *  32-deep slices in one buffer, the next prefetched into registers. */
export const MMA_TILE = Object.freeze({ sgm: 2, sgn: 2, tm: 4, tn: 4, bk: 32, nbuf: 1 });

/** The device features the kernel needs: createContext requests them for its `mixed`; the fp32
 *  engine never does. */
export const MMA_FEATURES = ['shader-f16', 'chromium-experimental-subgroup-matrix'];

/** Workgroup memory of the engine's tile, over the three operand layouts it runs. */
const MMA_TILE_BYTES = Math.max(...[[0, 1], [0, 0], [1, 0]].map(([aT, bT]) =>
  mmaPlan({ ...MMA_TILE, aT, bT }).bytes));

/** Whether ctx (context.js) can run the mixed-precision matmuls: the features, an f16 x f16 ->
 *  f32 16 x 16 x 16 subgroup-matrix config, 32-lane subgroups (the kernel's lane math) and the
 *  workgroup memory of its tile (ctx.limits, else the adapter's). */
export function mixedSupport(ctx) {
  const info = ctx.adapter?.info ?? {};
  const why = [];
  for (const f of MMA_FEATURES) if (!ctx.features.includes(f)) why.push(`no ${f}`);
  const wgMem = (ctx.limits ?? ctx.adapter?.limits)?.maxComputeWorkgroupStorageSize ?? 0;
  if (wgMem < MMA_TILE_BYTES) why.push(`${wgMem} B of workgroup memory, the tile needs ${MMA_TILE_BYTES}`);
  const ok = (info.subgroupMatrixConfigs ?? []).some((c) => c.componentType === 'f16'
    && c.resultComponentType === 'f32' && c.M === 16 && c.N === 16 && c.K === 16);
  if (!ok && !why.length) why.push('no f16 x f16 -> f32 16x16x16 subgroup matrix');
  if (!why.length && !(info.subgroupMinSize === 32 && info.subgroupMaxSize === 32)) {
    why.push(`subgroups of ${info.subgroupMinSize}-${info.subgroupMaxSize} lanes, not 32`);
  }
  return { ok: !why.length, why: why.join('; ') };
}

/** Tile and layout of a variant, with its derived sizes. */
export function mmaPlan(v) {
  const p = { pad: 8, nbuf: 2, input: 'f32', accum: false, syntax: 'template', ...v };
  p.aIn = v.aIn ?? p.input;
  p.bIn = v.bIn ?? p.input;
  p.BM = p.sgm * p.tm * 16;
  p.BN = p.sgn * p.tn * 16;
  p.threads = 32 * p.sgm * p.sgn;
  p.LDA = (p.aT ? p.BM : p.bk) + p.pad;       // workgroup row strides, in halves
  p.LDB = (p.bT ? p.bk : p.BN) + p.pad;
  p.SA = (p.aT ? p.bk : p.BM) * p.LDA;        // one slice buffer, in halves
  p.SB = (p.bT ? p.BN : p.bk) * p.LDB;
  p.bytes = 2 * p.nbuf * (p.SA + p.SB);
  return p;
}

/** Staged copy of one operand's slice: its global vector index and workgroup offset per load. */
function stager(p, name, rowsPerSlice, cols, ld, sbuf, base, rowStride) {
  // The slice is `rowsPerSlice` global rows of `cols` contiguous elements.
  const input = name === 'a' ? p.aIn : p.bIn;
  const VW = input === 'f16' ? 8 : 4;   // elements per global vector load
  const vr = cols / VW;
  const loads = (rowsPerSlice * vr) / p.threads;
  if (!Number.isInteger(loads) || loads < 1) {
    throw new Error(`${name}: ${rowsPerSlice} x ${cols} slice is not a whole number of loads`);
  }
  const regs = [];
  const fetch = [];
  const put = [];
  const vt = input === 'f16' ? 'vec4<u32>' : 'vec4<f32>';
  for (let i = 0; i < loads; i++) {
    const r = `${name}r${i}`;
    regs.push(`var ${r}: ${vt};`);
    // q = tid + i * threads: row q / vr, vector q % vr of the slice
    const q = `(tid + ${i * p.threads}u)`;
    fetch.push(`${r} = ${name}[(${base(`${q} / ${vr}u`)} + ${rowStride}) / ${VW}u + ${q} % ${vr}u];`);
    const off = `${sbuf} + (${q} / ${vr}u) * ${ld}u + (${q} % ${vr}u) * ${VW}u`;
    if (input === 'f16') {
      put.push(`{ let o = ${off};`);
      for (let w = 0; w < 4; w++) {
        put.push(`  let h${w} = bitcast<vec2<f16>>(${r}[${w}]); s${name}[o + ${2 * w}u] = h${w}.x; ` +
          `s${name}[o + ${2 * w + 1}u] = h${w}.y;`);
      }
      put.push('}');
    } else {
      put.push(`{ let o = ${off}; let h = vec4<f16>(${r}); s${name}[o] = h.x; s${name}[o + 1u] = h.y; ` +
        `s${name}[o + 2u] = h.z; s${name}[o + 3u] = h.w; }`);
    }
  }
  return { regs, fetch: (k0) => fetch.map((l) => l.replaceAll('K0', k0)), put, vt };
}

// The builtins' two spellings: majorness as a template argument (the current proposal), or as a
// bool argument (the first Chromium releases; deprecated since). MmaOps finds which this Dawn takes.
/** subgroupMatrixLoad of matrix type T from ptr at element off, rows (or columns) stride apart. */
export function matrixLoad(syntax, T, ptr, off, colMajor, stride) {
  return syntax === 'template'
    ? `subgroupMatrixLoad<${T}, ${colMajor ? 'col_major' : 'row_major'}>(${ptr}, ${off}, ${stride})`
    : `subgroupMatrixLoad<${T}>(${ptr}, ${off}, ${colMajor}, ${stride})`;
}

/** subgroupMatrixStore of v to ptr at element off (a statement). */
export function matrixStore(syntax, ptr, off, v, colMajor, stride) {
  return syntax === 'template'
    ? `subgroupMatrixStore<${colMajor ? 'col_major' : 'row_major'}>(${ptr}, ${off}, ${v}, ${stride});`
    : `subgroupMatrixStore(${ptr}, ${off}, ${v}, ${colMajor}, ${stride});`;
}

/** The WGSL of variant `v` ({sgm, sgn, tm, tn, bk, aT, bT, pad?, nbuf?, unroll?, input?}). */
export function mmaShader(v) {
  const p = mmaPlan(v);
  const { BM, BN, bk, tm, tn, LDA, LDB, SA, SB } = p;
  if (bk % 16) throw new Error(`bk ${bk} must be a multiple of 16`);
  // Global element (row of the slice, first column) of each operand, K0 = the slice's first k.
  const a = p.aT
    ? stager(p, 'a', bk, BM, LDA, 'abuf', (r) => `(K0 + ${r}) * dims.M`, 'm0')
    : stager(p, 'a', BM, bk, LDA, 'abuf', (r) => `(m0 + ${r}) * dims.K`, 'K0');
  const b = p.bT
    ? stager(p, 'b', BN, bk, LDB, 'bbuf', (r) => `(n0 + ${r}) * dims.K`, 'K0')
    : stager(p, 'b', bk, BN, LDB, 'bbuf', (r) => `(K0 + ${r}) * dims.N`, 'n0');
  const load = (T, ptr, off, colMajor, stride) => matrixLoad(p.syntax, T, ptr, off, colMajor, stride);
  const storeOf = (off, v) => matrixStore(p.syntax, '&c', off, v, false, 'dims.N');
  const L = 'subgroup_matrix_left<f16, 16, 16>';
  const R = 'subgroup_matrix_right<f16, 16, 16>';
  const C = 'subgroup_matrix_result<f32, 16, 16>';
  const acc = [];
  const math = [];
  for (let kk = 0; kk < bk / 16; kk++) {
    for (let i = 0; i < tm; i++) {
      const off = p.aT ? `cur * ${SA}u + ${kk * 16 * LDA}u + am + ${16 * i}u`
        : `cur * ${SA}u + (am + ${16 * i}u) * ${LDA}u + ${kk * 16}u`;
      math.push(`let l${kk}_${i} = ${load(L, '&sa', off, Boolean(p.aT), `${LDA}u`)};`);
    }
    for (let j = 0; j < tn; j++) {
      const off = p.bT ? `cur * ${SB}u + (bn + ${16 * j}u) * ${LDB}u + ${kk * 16}u`
        : `cur * ${SB}u + ${kk * 16 * LDB}u + bn + ${16 * j}u`;
      math.push(`let r${kk}_${j} = ${load(R, '&sb', off, Boolean(p.bT), `${LDB}u`)};`);
    }
    for (let i = 0; i < tm; i++) {
      for (let j = 0; j < tn; j++) {
        math.push(`c${i}_${j} = subgroupMatrixMultiplyAccumulate(l${kk}_${i}, r${kk}_${j}, c${i}_${j});`);
      }
    }
  }
  const store = [];
  for (let i = 0; i < tm; i++) {
    for (let j = 0; j < tn; j++) {
      const off = `slab + (m0 + am + ${16 * i}u) * dims.N + n0 + bn + ${16 * j}u`;
      acc.push(`var c${i}_${j} = ${p.accum ? load(C, '&c', off, false, 'dims.N') : `${C}()`};`);
      store.push(storeOf(off, `c${i}_${j}`));
    }
  }
  // The first slice, into buffer 0 (double-buffered loops).
  const first = `
  ${a.fetch('kBeg').join('\n  ')}
  ${b.fetch('kBeg').join('\n  ')}
  { let abuf = 0u; let bbuf = 0u;
    ${a.put.join('\n    ')}
    ${b.put.join('\n    ')} }
  workgroupBarrier();`;
  // One slice k of a double-buffered loop: the next slice is read while this one (buffer `cur`)
  // is multiplied, then stored at abuf / bbuf (the other buffer); one barrier.
  const slice = (k, abuf, bbuf) => `let more = ${k} + ${bk}u < kEnd;
    if (more) {
      ${a.fetch(`(${k} + ${bk}u)`).join('\n      ')}
      ${b.fetch(`(${k} + ${bk}u)`).join('\n      ')}
    }
    ${math.join('\n    ')}
    if (more) {
      let abuf = ${abuf}; let bbuf = ${bbuf};
      ${a.put.join('\n      ')}
      ${b.put.join('\n      ')}
    }
    workgroupBarrier();`;
  // unroll: the loop body is two slices, one per buffer, each with `cur` a const, so every
  // fragment's workgroup offset is a constant plus the subgroup's own (as with nbuf 1).
  const loop = p.nbuf === 2 && p.unroll ? `${first}
  for (var k0 = kBeg; k0 < kEnd; k0 += ${2 * bk}u) {
    { const cur = 0u; ${slice('k0', `${SA}u`, `${SB}u`)} }
    if (k0 + ${bk}u >= kEnd) { break; }
    { const cur = 1u; ${slice(`(k0 + ${bk}u)`, '0u', '0u')} }
  }` : p.nbuf === 2 ? `${first}
  var cur = 0u;
  for (var k0 = kBeg; k0 < kEnd; k0 += ${bk}u) {
    ${slice('k0', `(1u - cur) * ${SA}u`, `(1u - cur) * ${SB}u`)}
    cur = 1u - cur;
  }` : `
  ${a.fetch('kBeg').join('\n  ')}
  ${b.fetch('kBeg').join('\n  ')}
  let cur = 0u;
  for (var k0 = kBeg; k0 < kEnd; k0 += ${bk}u) {
    { let abuf = 0u; let bbuf = 0u;
      ${a.put.join('\n      ')}
      ${b.put.join('\n      ')} }
    workgroupBarrier();
    if (k0 + ${bk}u < kEnd) {
      ${a.fetch(`(k0 + ${bk}u)`).join('\n      ')}
      ${b.fetch(`(k0 + ${bk}u)`).join('\n      ')}
    }
    ${math.join('\n    ')}
    workgroupBarrier();
  }`;
  return `enable f16;
enable chromium_experimental_subgroup_matrix;
// The subgroup index (local_invocation_index / 32) is not workgroup-uniform, but each subgroup's
// own matrix operations are: the uniformity analysis cannot see that.
diagnostic(off, chromium.subgroup_matrix_uniformity);

struct Dims { M: u32, N: u32, K: u32, KS: u32 }   // KS: K rows per split
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> a: array<${a.vt}>;   // [M, K] or [K, M]
@group(0) @binding(2) var<storage, read> b: array<${b.vt}>;   // [K, N] or [N, K]
@group(0) @binding(3) var<storage, read_write> c: array<f32>;   // [splits, M, N]

var<workgroup> sa: array<f16, ${p.nbuf * SA}>;
var<workgroup> sb: array<f16, ${p.nbuf * SB}>;

@compute @workgroup_size(${p.threads})
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
  let sg = tid / 32u;
  let am = (sg / ${p.sgn}u) * ${tm * 16}u;   // this subgroup's rows and columns in the block
  let bn = (sg % ${p.sgn}u) * ${tn * 16}u;
  let m0 = wg.y * ${BM}u;
  let n0 = wg.x * ${BN}u;
  let kBeg = wg.z * dims.KS;
  let kEnd = min(kBeg + dims.KS, dims.K);
  let slab = wg.z * dims.M * dims.N;
  ${a.regs.join('\n  ')}
  ${b.regs.join('\n  ')}
  ${acc.join('\n  ')}
  ${loop}
  ${store.join('\n  ')}
}
`;
}
