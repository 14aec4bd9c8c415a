// Register-tiled matmul core: out[R, S] = sum_r A(i, r) * B(r, j).
// The including file defines the operand accessors and the store:
//   fn load_a(i: u32, r: u32) -> f32    (returns 0 outside [R, INNER])
//   fn load_b(r: u32, j: u32) -> f32    (returns 0 outside [INNER, S])
//   fn store_c(i: u32, j: u32, v: f32)  (only called inside [R, S])
//   A_ALONG_R, B_ALONG_R : bool         whether consecutive r are adjacent in memory for that
//                                       operand (else consecutive i, resp. j, are); the tile fill
//                                       then gives neighbouring threads neighbouring words
// and a uniform `mm` with fields R, S, INNER, KCHUNK. With KCHUNK > 0 (split-K), workgroup z sums
// only r in [z * KCHUNK, (z + 1) * KCHUNK) (KCHUNK a multiple of BK); 0 sums all of INNER.
// Each workgroup computes a TILE x TILE block of out with TG x TG threads, 4x4 outputs each
// (TILE = 4 * TG); the reduction dimension advances BK at a time through workgroup memory.
// Dispatch: (ceil(S / TILE), ceil(R / TILE), splits) workgroups of TG x TG threads.

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
