// 11_linear_backward: gradients of y = x @ W^T (x [M, K], W [N, K], dy [M, N]).
//
// MODE 0 (input grad):  dx[M, K]  = dy @ W        R = M, S = K, INNER = N   (= write)
// MODE 1 (weight grad): dW[N, K] += dy^T @ x      R = N, S = K, INNER = M   (+= accumulate:
//                       G is zeroed by the optimizer; the tied embedding also gets embed grads)
//
// Bindings:
//   @binding(0) mm  : MatmulDims  uniform  {R, S, INNER} as above
//   @binding(1) dy  : array<f32>  [M, N]  read
//   @binding(2) src : array<u32>  MODE 0: W [N, K] (f32 bits, or f16 mirror with W_F16)
//                                 MODE 1: x [M, K] (f32 bits)
//   @binding(3) out : array<f32>  MODE 0: dx [M, K] (=);  MODE 1: dW [N, K] (+=)
// Dispatch: (ceil(S / 32), ceil(R / 32)) workgroups of 8 x 8 threads.

override MODE: u32 = 0u;
override W_F16: bool = false;

@group(0) @binding(0) var<uniform> mm: MatmulDims;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

//#include "lib/matmul_core.wgsl"
//#include "lib/weights.wgsl"

fn load_a(i: u32, r: u32) -> f32 {
  if (i >= mm.R || r >= mm.INNER) { return 0.0; }
  if (MODE == 0u) { return dy[i * mm.INNER + r]; }   // dy[m = i, n = r], row stride N = INNER
  return dy[r * mm.R + i];                            // dy[m = r, n = i], row stride N = R
}

fn load_b(r: u32, j: u32) -> f32 {
  if (r >= mm.INNER || j >= mm.S) { return 0.0; }
  if (MODE == 0u) { return load_w(r * mm.S + j); }    // W[n = r, k = j]
  return bitcast<f32>(w[r * mm.S + j]);               // x[m = r, k = j]
}

fn store_c(i: u32, j: u32, v: f32) {
  let o = i * mm.S + j;
  if (MODE == 0u) { out[o] = v; } else { out[o] = out[o] + v; }
}

@compute @workgroup_size(8, 8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  matmul_tile(wid, lid);
}
