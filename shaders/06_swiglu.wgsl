// 06_swiglu: h = silu(gate) * up, from the fused gate|up projection output.
//
//   @binding(0) dims : {N = B*T, F}            uniform
//   @binding(1) gu   : array<f32> [N, 2F]      read (gate at [0, F), up at [F, 2F))
//   @binding(2) h    : array<f32> [N, F]       = silu(gate) * up
// Dispatch: ceil(N*F / WG) workgroups (2-D when over 65535).

//#include "lib/common.wgsl"
//#include "lib/swiglu.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = flat_id(gid, nwg, WG);
  if (e >= dims.N * dims.F) { return; }
  let gi = gate_at(e);
  h[e] = silu(gu[gi]) * gu[gi + dims.F];
}

fn silu(g: f32) -> f32 {
  return g / (1.0 + exp(-g));
}
