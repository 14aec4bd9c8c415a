// 09_ffn_backward: gradient of h = silu(gate) * up with respect to the fused gate|up output.
//   dgate = dh * up * s * (1 + gate * (1 - s)),  dup = dh * silu(gate),  s = sigmoid(gate)
//
//   @binding(0) dims : {N = B*T, F}            uniform
//   @binding(1) gu   : array<f32> [N, 2F]      read (forward's gate|up)
//   @binding(2) dh   : array<f32> [N, F]       read
//   @binding(3) dgu  : array<f32> [N, 2F]      = (dgate | dup)
// Dispatch: ceil(N*F / WG) workgroups (2-D when over 65535).

//#include "lib/common.wgsl"
//#include "lib/swiglu.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read> dh: array<f32>;
@group(0) @binding(3) var<storage, read_write> dgu: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = flat_id(gid, nwg, WG);
  if (e >= dims.N * dims.F) { return; }
  let gi = gate_at(e);
  let g = gu[gi];
  let u = gu[gi + dims.F];
  let s = 1.0 / (1.0 + exp(-g));
  let d = dh[e];
  dgu[gi] = d * u * s * (1.0 + g * (1.0 - s));
  dgu[gi + dims.F] = d * g * s;
}
