// 08_embed_backward: dWte[v, :] += sum of dx rows whose token is v.
// One thread per vocabulary row scans the batch's tokens in order and adds the matching rows:
// no atomics, so the sum order is fixed and runs are bitwise reproducible.
// Cost: V * N token compares plus N * C adds.
//
//   @binding(0) dims   : {N = B*T, C, V}     uniform
//   @binding(1) tokens : array<u32> [N]      read
//   @binding(2) dx     : array<f32> [N, C]   read (gradient of the embedding output)
//   @binding(3) dwte   : array<f32> [V, C]   += (tied with the LM head, which adds first)
// Dispatch: ceil(V / WG) workgroups (2-D when over 65535).

//#include "lib/common.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

struct Dims { N: u32, C: u32, V: u32, pad: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> dx: array<f32>;
@group(0) @binding(3) var<storage, read_write> dwte: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let v = flat_id(gid, nwg, WG);
  if (v >= dims.V) { return; }
  for (var n = 0u; n < dims.N; n = n + 1u) {
    if (tokens[n] != v) { continue; }
    for (var c = 0u; c < dims.C; c = c + 1u) {
      dwte[v * dims.C + c] = dwte[v * dims.C + c] + dx[n * dims.C + c];
    }
  }
}
