// 11_linear_backward: gradients of y = x @ W^T (x [M, K], W [N, K], dy [M, N]).
//
// MODE 0 (input grad):  dx[M, K]  = dy @ W        R = M, S = K, INNER = N   (= write)
// MODE 1 (weight grad): dW[N, K] += dy^T @ x      R = N, S = K, INNER = M   (+= accumulate:
//                       G is zeroed by the optimizer; the tied embedding also gets embed grads)
// MODE 2 (weight grad, split-K): part[z, N, K] = dy^T @ x over rows [z * KCHUNK, (z+1) * KCHUNK)
//                       of M; then add_partials: dW[N, K] += sum over z of part[z] (z in order,
//                       so the result is deterministic). A weight gradient sums over all B*T
//                       rows; splitting them gives small weights enough workgroups.
//
// Bindings:
//   @binding(0) mm  : MatmulDims  uniform  {R, S, INNER} as above
//   @binding(1) dy  : array<f32>  [M, N]  read
//   @binding(2) w   : array<u32>  MODE 0: W [N, K] (f32 bits, or f16 mirror with W_F16)
//                                 MODE 1: x [M, K] (f32 bits)
//   @binding(3) out : array<f32>  MODE 0: dx [M, K] (=);  MODE 1: dW [N, K] (+=);
//                                 MODE 2: part [splits, N, K] (=)
// Dispatch: main: (ceil(S / TILE), ceil(R / TILE), splits) workgroups of TG x TG threads,
// TILE = 4 * TG; main_wide: (ceil(S / (8 WX)), ceil(R / (8 WY)), splits) of WX * WY threads
// main_direct: (grid1d(ceil(ceil(R / 8) * ceil(S / 8) / DWG)), splits) of DWG threads
// (splits 1 unless MODE 2, whose mm.KCHUNK is the rows per split).
//
// add_partials: dW[o] += sum_z part[z * R * S + o]
//   @binding(0) mm : {R = N, S = K, INNER = splits}   @binding(1) dy: part   @binding(3) out: dW
//   (binding 2 unbound)
//   Dispatch: grid1d(ceil(N * K / WG)) workgroups of WG threads (kernels.js passes WG).

override MODE: u32 = 0u;
override WG: u32;   // add_partials workgroup size
override W_F16: bool = false;
override A_ALONG_R: bool = MODE == 0u;   // dy[i, r] (MODE 0) or dy[r, i] (MODE 1, 2)
const B_ALONG_R: bool = false;           // W[r, j] or x[r, j]: j is contiguous

@group(0) @binding(0) var<uniform> mm: MatmulDims;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

//#include "lib/matmul_core.wgsl"
//#include "lib/weights.wgsl"
//#include "lib/common.wgsl"

var<private> part_base: u32;   // MODE 2: this split's slice of part

fn a_at(i: u32, r: u32) -> f32 {
  if (MODE == 0u) { return dy[i * mm.INNER + r]; }   // dy[m = i, n = r], row stride N = INNER
  return dy[r * mm.R + i];                            // dy[m = r, n = i], row stride N = R
}

fn b_at(r: u32, j: u32) -> f32 {
  if (MODE == 0u) { return load_w(r * mm.S + j); }    // W[n = r, k = j]
  return bitcast<f32>(w[r * mm.S + j]);               // x[m = r, k = j]
}

fn store_c(i: u32, j: u32, v: f32) {
  let o = i * mm.S + j;
  if (MODE == 0u) { out[o] = v; }
  else if (MODE == 1u) { out[o] = out[o] + v; }
  else { out[part_base + o] = v; }
}

@compute @workgroup_size(TG, TG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  part_base = wid.z * mm.R * mm.S;
  matmul_tile(wid, lid);
}

@compute @workgroup_size(WX * WY)
fn main_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  part_base = wid.z * mm.R * mm.S;
  matmul_wide(wid, t);
}

@compute @workgroup_size(DWG)
fn main_direct(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
  part_base = gid.z * mm.R * mm.S;
  matmul_direct(gid, nwg);
}

@compute @workgroup_size(WG)
fn add_partials(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
  let o = flat_id(gid, nwg, WG);
  let n = mm.R * mm.S;
  if (o >= n) { return; }
  var acc = 0.0;
  for (var z = 0u; z < mm.INNER; z = z + 1u) { acc = acc + dy[z * n + o]; }
  out[o] = out[o] + acc;
}
