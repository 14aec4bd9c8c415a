// 02_norm: RMSNorm, y = x * rsqrt(mean(x^2) + eps) * g   (Llama / HF LlamaRMSNorm).
//
// rmsnorm_forward
//   @binding(0) dims : {N rows, C, eps}   uniform
//   @binding(1) x    : array<f32> [N, C]  read
//   @binding(2) g    : array<f32> [C]     read (norm gain)
//   @binding(3) y    : array<f32> [N, C]  = normalised output
//   @binding(4) rstd : array<f32> [N]     = rsqrt(mean(x^2) + eps), kept for backward
// Dispatch: N workgroups (2-D when over 65535) of WG threads, one row each.
//
// rmsnorm_forward_direct: the same at WG 8 with a row per thread (row_sum8), for a software
// adapter (kernels.js): no workgroup memory or barriers, the same bits.
// Dispatch: grid1d(ceil(N / DWG)) workgroups of DWG threads.

//#include "lib/common.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

struct Dims { N: u32, C: u32, eps: f32, pad: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> rstd: array<f32>;

//#include "lib/row_sum.wgsl"

fn row_term(base: u32, c: u32) -> f32 {   // the row's sum of squares
  let v = x[base + c];
  return v * v;
}

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) t: u32) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= dims.N) { return; }   // uniform per workgroup, so barriers stay uniform
  let base = row * dims.C;
  let r = inverseSqrt(row_sum(t, base) / f32(dims.C) + dims.eps);
  for (var c = t; c < dims.C; c = c + WG) { y[base + c] = g[c] * (x[base + c] * r); }
  if (t == 0u) { rstd[row] = r; }
}

@compute @workgroup_size(DWG)
fn rmsnorm_forward_direct(@builtin(global_invocation_id) gid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = flat_id(gid, nwg, DWG);
  if (row >= dims.N) { return; }
  let base = row * dims.C;
  let r = inverseSqrt(row_sum8(base) / f32(dims.C) + dims.eps);
  for (var c = 0u; c < dims.C; c = c + 1u) { y[base + c] = g[c] * (x[base + c] * r); }
  rstd[row] = r;
}
