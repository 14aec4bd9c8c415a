// Register-tiled matmul core: out[R, S] = sum_r A(i, r) * B(r, j).
// The including file defines the operand accessors and the store:
//   fn load_a(i: u32, r: u32) -> f32    (returns 0 outside [R, INNER])
//   fn load_b(r: u32, j: u32) -> f32    (returns 0 outside [INNER, S])
//   fn store_c(i: u32, j: u32, v: f32)  (only called inside [R, S])
// and a uniform `mm` with fields R, S, INNER.
// Each workgroup computes a TILE x TILE block of out with 8x8 threads, 4x4 outputs each;
// the reduction dimension advances BK at a time through workgroup memory.
// Dispatch: (ceil(S / TILE), ceil(R / TILE)) workgroups of 64 threads.

const TILE: u32 = 32u;
const BK: u32 = 16u;

struct MatmulDims { R: u32, S: u32, INNER: u32, pad: u32 }

var<workgroup> tile_a: array<array<f32, TILE>, BK>;  // [BK][TILE]: A(i0 + ii, r0 + kk)
var<workgroup> tile_b: array<array<f32, TILE>, BK>;  // [BK][TILE]: B(r0 + kk, j0 + jj)

fn matmul_tile(wid: vec3<u32>, lid: vec3<u32>) {
  let i0 = wid.y * TILE;
  let j0 = wid.x * TILE;
  let t = lid.y * 8u + lid.x;
  var acc: array<array<f32, 4>, 4>;
  for (var r0 = 0u; r0 < mm.INNER; r0 = r0 + BK) {
    // 64 threads load 2 x 512 elements: 8 each from A and from B.
    for (var e = t; e < BK * TILE; e = e + 64u) {
      let kk = e / TILE;
      let x = e % TILE;
      tile_a[kk][x] = load_a(i0 + x, r0 + kk);
      tile_b[kk][x] = load_b(r0 + kk, j0 + x);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk = kk + 1u) {
      var a: array<f32, 4>;
      var b: array<f32, 4>;
      for (var u = 0u; u < 4u; u = u + 1u) {
        a[u] = tile_a[kk][lid.y * 4u + u];
        b[u] = tile_b[kk][lid.x * 4u + u];
      }
      for (var u = 0u; u < 4u; u = u + 1u) {
        for (var v = 0u; v < 4u; v = v + 1u) {
          acc[u][v] = fma(a[u], b[v], acc[u][v]);
        }
      }
    }
    workgroupBarrier();
  }
  for (var u = 0u; u < 4u; u = u + 1u) {
    let i = i0 + lid.y * 4u + u;
    for (var v = 0u; v < 4u; v = v + 1u) {
      let j = j0 + lid.x * 4u + v;
      if (i < mm.R && j < mm.S) { store_c(i, j, acc[u][v]); }
    }
  }
}
