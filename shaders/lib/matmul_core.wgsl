// Register-tiled matmul core: out[R, S] = sum_r A(i, r) * B(r, j).
// The including file defines the operand accessors and the store:
//   fn a_at(i: u32, r: u32) -> f32      A(i, r), only called inside [R, INNER]
//   fn b_at(r: u32, j: u32) -> f32      B(r, j), only called inside [INNER, S]
//   fn store_c(i: u32, j: u32, v: f32)  (only called inside [R, S])
//   A_ALONG_R, B_ALONG_R : bool         whether consecutive r are adjacent in memory for that
//                                       operand (else consecutive i, resp. j, are); the tile fill
//                                       then gives neighbouring threads neighbouring words
// and a uniform `mm` with fields R, S, INNER, KCHUNK. With KCHUNK > 0 (split-K), workgroup z sums
// only r in [z * KCHUNK, (z + 1) * KCHUNK) (KCHUNK a multiple of BK); 0 sums all of INNER.
// Small tile (matmul_tile, the includers' `main`): each workgroup computes a TILE x TILE block of
// out with TG x TG threads, 4x4 outputs each (TILE = 4 * TG); the reduction dimension advances
// BK at a time through workgroup memory.
// Dispatch: (ceil(S / TILE), ceil(R / TILE), splits) workgroups of TG x TG threads.
// Wide tile (matmul_wide, `main_wide`, for big problems) and the direct kernel (matmul_direct,
// `main_direct`, for software adapters): further below.

override TG: u32 = 8u;       // threads per side of the workgroup (the includer's workgroup_size)
override TILE: u32 = 4u * TG;
override TP: u32 = TG + 1u;  // tile row stride in vec4s: the padding spreads an along-r fill's
                             // stores (one per kk) over the banks
override BK: u32 = 16u;      // reduction step (kernels.js passes its BK, which split-K relies on)

struct MatmulDims { R: u32, S: u32, INNER: u32, KCHUNK: u32 }

var<workgroup> tile_a: array<vec4<f32>, BK * TP>;  // [BK][TP]: A(i0 + ii, r0 + kk), ii < TILE
var<workgroup> tile_b: array<vec4<f32>, BK * TP>;  // [BK][TP]: B(r0 + kk, j0 + jj), jj < TILE

fn matmul_tile(wid: vec3<u32>, lid: vec3<u32>) {
  let i0 = wid.y * TILE;
  let j0 = wid.x * TILE;
  let t = lid.y * TG + lid.x;
  // 4x4 outputs per thread as four vec4 rows, updated with vec4 FMAs: no dynamically indexed
  // private arrays (which software adapters spill to memory).
  var acc0 = vec4<f32>(0.0);
  var acc1 = vec4<f32>(0.0);
  var acc2 = vec4<f32>(0.0);
  var acc3 = vec4<f32>(0.0);
  let r_begin = wid.z * mm.KCHUNK;
  let r_end = select(mm.INNER, min(r_begin + mm.KCHUNK, mm.INNER), mm.KCHUNK > 0u);
  for (var r0 = r_begin; r0 < r_end; r0 = r0 + BK) {
    // TG*TG threads fill 2 x BK x TILE elements as vec4s of 4 consecutive i (or j): thread e
    // takes kk = e / TG, or kk = e % BK when the operand is contiguous along r, so that
    // neighbouring threads read neighbouring words.
    for (var e = t; e < BK * TG; e = e + TG * TG) {
      let ka = select(e / TG, e % BK, A_ALONG_R);   // reduction index in the tile
      let va = select(e % TG, e / BK, A_ALONG_R);   // vec4 of rows 4va .. 4va + 3
      tile_a[ka * TP + va] = load_a4(i0 + 4u * va, r0 + ka);
      let kb = select(e / TG, e % BK, B_ALONG_R);
      let vb = select(e % TG, e / BK, B_ALONG_R);
      tile_b[kb * TP + vb] = load_b4(r0 + kb, j0 + 4u * vb);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk = kk + 1u) {
      let a = tile_a[kk * TP + lid.y];
      let b = tile_b[kk * TP + lid.x];
      acc0 = fma(vec4<f32>(a.x), b, acc0);
      acc1 = fma(vec4<f32>(a.y), b, acc1);
      acc2 = fma(vec4<f32>(a.z), b, acc2);
      acc3 = fma(vec4<f32>(a.w), b, acc3);
    }
    workgroupBarrier();
  }
  store_row(i0 + lid.y * 4u, j0 + lid.x * 4u, acc0);
  store_row(i0 + lid.y * 4u + 1u, j0 + lid.x * 4u, acc1);
  store_row(i0 + lid.y * 4u + 2u, j0 + lid.x * 4u, acc2);
  store_row(i0 + lid.y * 4u + 3u, j0 + lid.x * 4u, acc3);
}

// Wide tile (the includers' `main_wide` entry point): a (8 WY) x (8 WX) block of out per
// workgroup of WX * WY threads, 8x8 outputs per thread as 16 vec4 accumulators: block rows
// 4ty .. 4ty + 3 and 4(ty + WY) .. + 3, columns 4tx .. 4tx + 3 and 4(tx + WX) .. + 3, so a
// reduction step reads 4 vec4s of workgroup memory for 64 FMAs (the small tile: 2 for 16).
// The WBK slices are double-buffered in workgroup memory: each thread loads its entries of slice
// n + 1 into registers before the FMAs of slice n and stores them after: one barrier a slice.
// A thread fills one or two vec4 entries of each operand's slice (WBK * 2 WY of A, WBK * 2 WX of
// B, over WX * WY threads), so max(WX, WY) <= 2 WBK and WBK <= min(WX, WY). Each output still
// sums r in increasing order from zero, one FMA per r, as the small tile does: the two give the
// same bits.
// Dispatch: (ceil(S / (8 WX)), ceil(R / (8 WY)), splits) workgroups of WX * WY threads (1-D).

const WBK: u32 = 8u;               // reduction step (written out as 8 steps in the loop below)
override WX: u32;                  // threads along S: a multiple of 8
override WY: u32;                  // threads along R: a multiple of 4
override WAP: u32 = 2u * WY + 1u;  // slice row strides in vec4s, padded as TP is
override WBP: u32 = 2u * WX + 1u;

var<workgroup> wide_a: array<vec4<f32>, 2u * WBK * WAP>;  // [2][WBK][WAP]: A(i0 + 4v .. + 3, r)
var<workgroup> wide_b: array<vec4<f32>, 2u * WBK * WBP>;  // [2][WBK][WBP]: B(r, j0 + 4v .. + 3)

fn matmul_wide(wid: vec3<u32>, t: u32) {
  let i0 = wid.y * 8u * WY;
  let j0 = wid.x * 8u * WX;
  // Each warp of 32 threads covers 8 x 4 (tx, ty): a step's reads touch 8 + 4 distinct vec4s.
  let w = t / 32u;
  let l = t % 32u;
  let tx = l % 8u + 8u * (w % (WX / 8u));
  let ty = l / 8u + 4u * (w / (WX / 8u));
  // This thread's slice entries e = t and t + WX * WY of each operand, as (kk, v), ordered as in
  // matmul_tile's fill so that neighbouring threads read neighbouring words.
  let e1 = t + WX * WY;
  let a0k = wide_kv(t, 2u * WY, A_ALONG_R);
  let a1k = wide_kv(e1, 2u * WY, A_ALONG_R);
  let b0k = wide_kv(t, 2u * WX, B_ALONG_R);
  let b1k = wide_kv(e1, 2u * WX, B_ALONG_R);
  let a1live = e1 < WBK * 2u * WY;
  let b1live = e1 < WBK * 2u * WX;
  var c = WideAcc();
  let r_begin = wid.z * mm.KCHUNK;
  let r_end = select(mm.INNER, min(r_begin + mm.KCHUNK, mm.INNER), mm.KCHUNK > 0u);
  var pa0 = load_a4(i0 + 4u * a0k.y, r_begin + a0k.x);
  var pa1 = wide_a4(i0, r_begin, a1k, a1live);
  var pb0 = load_b4(r_begin + b0k.x, j0 + 4u * b0k.y);
  var pb1 = wide_b4(j0, r_begin, b1k, b1live);
  var buf = 0u;
  wide_put(0u, a0k, a1k, b0k, b1k, a1live, b1live, pa0, pa1, pb0, pb1);
  workgroupBarrier();
  for (var r0 = r_begin; r0 < r_end; r0 = r0 + WBK) {
    let more = r0 + WBK < r_end;
    if (more) {
      pa0 = load_a4(i0 + 4u * a0k.y, r0 + WBK + a0k.x);
      pa1 = wide_a4(i0, r0 + WBK, a1k, a1live);
      pb0 = load_b4(r0 + WBK + b0k.x, j0 + 4u * b0k.y);
      pb1 = wide_b4(j0, r0 + WBK, b1k, b1live);
    }
    // The WBK = 8 steps of the slice written out: as a loop over kk the compiler kept the loop
    // and its index arithmetic, 8-14% slower on an H200 (bench/results/matmul_h200.txt).
    let sa = buf * WBK * WAP + ty;
    let sb = buf * WBK * WBP + tx;
    c = wide_fma(c, sa, sb);
    c = wide_fma(c, sa + WAP, sb + WBP);
    c = wide_fma(c, sa + 2u * WAP, sb + 2u * WBP);
    c = wide_fma(c, sa + 3u * WAP, sb + 3u * WBP);
    c = wide_fma(c, sa + 4u * WAP, sb + 4u * WBP);
    c = wide_fma(c, sa + 5u * WAP, sb + 5u * WBP);
    c = wide_fma(c, sa + 6u * WAP, sb + 6u * WBP);
    c = wide_fma(c, sa + 7u * WAP, sb + 7u * WBP);
    buf = 1u - buf;
    if (more) { wide_put(buf, a0k, a1k, b0k, b1k, a1live, b1live, pa0, pa1, pb0, pb1); }
    workgroupBarrier();
  }
  let ia = i0 + 4u * ty;
  let ib = ia + 4u * WY;
  let ja = j0 + 4u * tx;
  let jb = ja + 4u * WX;
  store_row(ia + 0u, ja, c.c0a);  store_row(ia + 0u, jb, c.c0b);
  store_row(ia + 1u, ja, c.c1a);  store_row(ia + 1u, jb, c.c1b);
  store_row(ia + 2u, ja, c.c2a);  store_row(ia + 2u, jb, c.c2b);
  store_row(ia + 3u, ja, c.c3a);  store_row(ia + 3u, jb, c.c3b);
  store_row(ib + 0u, ja, c.c4a);  store_row(ib + 0u, jb, c.c4b);
  store_row(ib + 1u, ja, c.c5a);  store_row(ib + 1u, jb, c.c5b);
  store_row(ib + 2u, ja, c.c6a);  store_row(ib + 2u, jb, c.c6b);
  store_row(ib + 3u, ja, c.c7a);  store_row(ib + 3u, jb, c.c7b);
}

// A wide-tile thread's 8x8 outputs: rows 4ty + q (c<q>) and 4(ty + WY) + q (c<q + 4>), columns
// 4tx .. + 3 (a) and 4(tx + WX) .. + 3 (b).
struct WideAcc {
  c0a: vec4<f32>, c0b: vec4<f32>, c1a: vec4<f32>, c1b: vec4<f32>,
  c2a: vec4<f32>, c2b: vec4<f32>, c3a: vec4<f32>, c3b: vec4<f32>,
  c4a: vec4<f32>, c4b: vec4<f32>, c5a: vec4<f32>, c5b: vec4<f32>,
  c6a: vec4<f32>, c6b: vec4<f32>, c7a: vec4<f32>, c7b: vec4<f32>,
}

// One reduction step: c += A(rows, r) B(r, columns) from the slice entries at sa (A) and sb (B).
fn wide_fma(c: WideAcc, sa: u32, sb: u32) -> WideAcc {
  let a0 = wide_a[sa];
  let a1 = wide_a[sa + WY];
  let b0 = wide_b[sb];
  let b1 = wide_b[sb + WX];
  return WideAcc(
    fma(vec4<f32>(a0.x), b0, c.c0a), fma(vec4<f32>(a0.x), b1, c.c0b),
    fma(vec4<f32>(a0.y), b0, c.c1a), fma(vec4<f32>(a0.y), b1, c.c1b),
    fma(vec4<f32>(a0.z), b0, c.c2a), fma(vec4<f32>(a0.z), b1, c.c2b),
    fma(vec4<f32>(a0.w), b0, c.c3a), fma(vec4<f32>(a0.w), b1, c.c3b),
    fma(vec4<f32>(a1.x), b0, c.c4a), fma(vec4<f32>(a1.x), b1, c.c4b),
    fma(vec4<f32>(a1.y), b0, c.c5a), fma(vec4<f32>(a1.y), b1, c.c5b),
    fma(vec4<f32>(a1.z), b0, c.c6a), fma(vec4<f32>(a1.z), b1, c.c6b),
    fma(vec4<f32>(a1.w), b0, c.c7a), fma(vec4<f32>(a1.w), b1, c.c7b));
}

// (kk, v) of entry e of a WBK x (4 n) slice: kk-major, or kk-minor when the operand is
// contiguous along r.
fn wide_kv(e: u32, n: u32, along_r: bool) -> vec2<u32> {
  if (along_r) { return vec2<u32>(e % WBK, e / WBK); }
  return vec2<u32>(e / n, e % n);
}

fn wide_a4(i0: u32, r0: u32, kv: vec2<u32>, live: bool) -> vec4<f32> {
  if (!live) { return vec4<f32>(0.0); }
  return load_a4(i0 + 4u * kv.y, r0 + kv.x);
}

fn wide_b4(j0: u32, r0: u32, kv: vec2<u32>, live: bool) -> vec4<f32> {
  if (!live) { return vec4<f32>(0.0); }
  return load_b4(r0 + kv.x, j0 + 4u * kv.y);
}

fn wide_put(buf: u32, a0k: vec2<u32>, a1k: vec2<u32>, b0k: vec2<u32>, b1k: vec2<u32>,
            a1live: bool, b1live: bool, a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>,
            b1: vec4<f32>) {
  wide_a[(buf * WBK + a0k.x) * WAP + a0k.y] = a0;
  wide_b[(buf * WBK + b0k.x) * WBP + b0k.y] = b0;
  if (a1live) { wide_a[(buf * WBK + a1k.x) * WAP + a1k.y] = a1; }
  if (b1live) { wide_b[(buf * WBK + b1k.x) * WBP + b1k.y] = b1; }
}

// A(i, r) and B(r, j), 0 outside the operands (the tiles' edges).
fn load_a(i: u32, r: u32) -> f32 {
  if (i >= mm.R || r >= mm.INNER) { return 0.0; }
  return a_at(i, r);
}

fn load_b(r: u32, j: u32) -> f32 {
  if (r >= mm.INNER || j >= mm.S) { return 0.0; }
  return b_at(r, j);
}

// A(i..i+3, r) and B(r, j..j+3) as vec4s: one tile entry.
fn load_a4(i: u32, r: u32) -> vec4<f32> {
  return vec4<f32>(load_a(i, r), load_a(i + 1u, r), load_a(i + 2u, r), load_a(i + 3u, r));
}

fn load_b4(r: u32, j: u32) -> vec4<f32> {
  return vec4<f32>(load_b(r, j), load_b(r, j + 1u), load_b(r, j + 2u), load_b(r, j + 3u));
}

fn store_row(i: u32, j: u32, v: vec4<f32>) {
  if (i >= mm.R) { return; }
  for (var u = 0u; u < 4u; u = u + 1u) {
    if (j + u < mm.S) { store_c(i, j + u, v[u]); }
  }
}

// Direct kernel (the includers' `main_direct`; kernels.js launches it on software adapters,
// ctx.software): no workgroup memory and no barriers, each invocation 8 x 8 outputs straight
// from storage, in 16 named vec4s (as the small tile: no dynamically indexed private array). A CPU adapter pays for every barrier and for a bounds check on every element the
// tiles stage: on SwiftShader this kernel runs tiny's matmuls 3-5x faster than the tiles
// (bench/results/tiny_swiftshader.txt), while a GPU needs the tiles' reuse of staged operands.
// Rows and columns past the edge are clamped to the last one (computed, never stored) instead of
// checked per element. Each output sums r in increasing order from zero, one FMA per r, as the
// tiles do: the same bits. Split-K as the tiles: workgroup z sums its KCHUNK.
// Dispatch: (grid1d(ceil(ceil(R / 8) * ceil(S / 8) / DWG)), splits) workgroups of DWG threads.
override DWG: u32 = 64u;

fn matmul_direct(gid: vec3<u32>, nwg: vec3<u32>) {
  let t = gid.x + gid.y * nwg.x * DWG;   // the 2-D grid of a long dispatch, linearised
  let groups = (mm.S + 7u) / 8u;
  let i = (t / groups) * 8u;
  let j = (t % groups) * 8u;             // < S
  if (i >= mm.R) { return; }
  let last_i = mm.R - 1u;
  let last_j = mm.S - 1u;
  let i1 = min(i + 1u, last_i); let i2 = min(i + 2u, last_i); let i3 = min(i + 3u, last_i);
  let i4 = min(i + 4u, last_i); let i5 = min(i + 5u, last_i); let i6 = min(i + 6u, last_i);
  let i7 = min(i + 7u, last_i);
  let j1 = min(j + 1u, last_j); let j2 = min(j + 2u, last_j); let j3 = min(j + 3u, last_j);
  let j4 = min(j + 4u, last_j); let j5 = min(j + 5u, last_j); let j6 = min(j + 6u, last_j);
  let j7 = min(j + 7u, last_j);
  // cRC: row i + R of columns j..j+3 (C 0) or j+4..j+7 (C 1)
  var c00 = vec4<f32>(0.0); var c10 = vec4<f32>(0.0); var c20 = vec4<f32>(0.0); var c30 = vec4<f32>(0.0);
  var c40 = vec4<f32>(0.0); var c50 = vec4<f32>(0.0); var c60 = vec4<f32>(0.0); var c70 = vec4<f32>(0.0);
  var c01 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0);
  var c41 = vec4<f32>(0.0); var c51 = vec4<f32>(0.0); var c61 = vec4<f32>(0.0); var c71 = vec4<f32>(0.0);
  let r_begin = gid.z * mm.KCHUNK;
  let r_end = select(mm.INNER, min(r_begin + mm.KCHUNK, mm.INNER), mm.KCHUNK > 0u);
  for (var r = r_begin; r < r_end; r = r + 1u) {
    let a = vec4<f32>(a_at(i, r), a_at(i1, r), a_at(i2, r), a_at(i3, r));
    let e = vec4<f32>(a_at(i4, r), a_at(i5, r), a_at(i6, r), a_at(i7, r));
    let b = vec4<f32>(b_at(r, j), b_at(r, j1), b_at(r, j2), b_at(r, j3));
    let f = vec4<f32>(b_at(r, j4), b_at(r, j5), b_at(r, j6), b_at(r, j7));
    c00 = fma(vec4<f32>(a.x), b, c00); c01 = fma(vec4<f32>(a.x), f, c01);
    c10 = fma(vec4<f32>(a.y), b, c10); c11 = fma(vec4<f32>(a.y), f, c11);
    c20 = fma(vec4<f32>(a.z), b, c20); c21 = fma(vec4<f32>(a.z), f, c21);
    c30 = fma(vec4<f32>(a.w), b, c30); c31 = fma(vec4<f32>(a.w), f, c31);
    c40 = fma(vec4<f32>(e.x), b, c40); c41 = fma(vec4<f32>(e.x), f, c41);
    c50 = fma(vec4<f32>(e.y), b, c50); c51 = fma(vec4<f32>(e.y), f, c51);
    c60 = fma(vec4<f32>(e.z), b, c60); c61 = fma(vec4<f32>(e.z), f, c61);
    c70 = fma(vec4<f32>(e.w), b, c70); c71 = fma(vec4<f32>(e.w), f, c71);
  }
  store_row(i, j, c00);      store_row(i, j + 4u, c01);
  store_row(i + 1u, j, c10); store_row(i + 1u, j + 4u, c11);
  store_row(i + 2u, j, c20); store_row(i + 2u, j + 4u, c21);
  store_row(i + 3u, j, c30); store_row(i + 3u, j + 4u, c31);
  store_row(i + 4u, j, c40); store_row(i + 4u, j + 4u, c41);
  store_row(i + 5u, j, c50); store_row(i + 5u, j + 4u, c51);
  store_row(i + 6u, j, c60); store_row(i + 6u, j + 4u, c61);
  store_row(i + 7u, j, c70); store_row(i + 7u, j + 4u, c71);
}
