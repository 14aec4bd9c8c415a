// 03_linear: y = x @ W^T (nn.Linear without bias), W stored [out, in] like PyTorch.
//
// Bindings:
//   @binding(0) mm : MatmulDims  uniform  {R = M rows, S = N outputs, INNER = K inputs}
//   @binding(1) x  : array<f32>  [M, K]   read
//   @binding(2) w  : array<u32>  [N, K]   read; f32 bits, or with W_F16 the f16 mirror
//                                         (two halves per u32, element e in half e & 1)
//   @binding(3) y  : array<f32>  [M, N]   y = x @ W^T, or y += x @ W^T with ACCUM
//                                         (ACCUM adds into a residual stream copied there first)
// Dispatch: main: (ceil(N / TILE), ceil(M / TILE)) workgroups of TG x TG threads (TILE = 4 * TG);
// main_wide: (ceil(N / (8 WX)), ceil(M / (8 WY))) workgroups of WX * WY threads; main_direct:
// grid1d(ceil(ceil(M / 8) * ceil(N / 8) / DWG)) workgroups of DWG threads.

override ACCUM: bool = false;
override W_F16: bool = false;
const A_ALONG_R: bool = true;   // x[i, r]: rows of x are contiguous
const B_ALONG_R: bool = true;   // W[j, r]: rows of W are contiguous

@group(0) @binding(0) var<uniform> mm: MatmulDims;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

//#include "lib/matmul_core.wgsl"
//#include "lib/weights.wgsl"

fn a_at(i: u32, r: u32) -> f32 { return x[i * mm.INNER + r]; }

fn b_at(r: u32, j: u32) -> f32 { return load_w(j * mm.INNER + r); }   // B(r, j) = W[j, r]

fn store_c(i: u32, j: u32, v: f32) {
  let o = i * mm.S + j;
  if (ACCUM) { y[o] = y[o] + v; } else { y[o] = v; }
}

@compute @workgroup_size(TG, TG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  matmul_tile(wid, lid);
}

@compute @workgroup_size(WX * WY)
fn main_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  matmul_wide(wid, t);
}

@compute @workgroup_size(DWG)
fn main_direct(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
  matmul_direct(gid, nwg);
}
