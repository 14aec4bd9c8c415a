// 00_init: weight initialisation on the GPU from a seed, so no weights are downloaded.
// normal: w = stdev * N(0, 1) from a counter-based hash (PCG) of (seed, element) and Box-Muller;
// ones:   w = 1 (norm gains).
//
//   @binding(0) p : {numel, seed, mode (0 normal, 1 ones), stdev, stream}   uniform
//   @binding(1) w : array<f32> [numel]   = (a tensor's sub-range of W)
// Dispatch: ceil(numel / WG) workgroups (2-D when over 65535).

//#include "lib/common.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

struct Params { numel: u32, seed: u32, mode: u32, stdev: f32, stream: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;

fn pcg(v: u32) -> u32 {
  let state = v * 747796405u + 2891336453u;
  let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = flat_id(gid, nwg, WG);
  if (e >= p.numel) { return; }
  if (p.mode == 1u) { w[e] = 1.0; return; }
  let key = pcg(p.seed ^ pcg(p.stream));
  let r1 = pcg(key ^ pcg(2u * e));
  let r2 = pcg(key ^ pcg(2u * e + 1u));
  let u1 = (f32(r1 >> 8u) + 1.0) / 16777217.0;   // (0, 1]: log() stays finite
  let u2 = f32(r2 >> 8u) / 16777216.0;
  w[e] = p.stdev * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
