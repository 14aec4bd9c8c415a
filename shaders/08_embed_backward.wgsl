// 08_embed_backward: dWte[v, :] += sum of dx rows whose token is v.
// One workgroup per vocabulary row scans the batch's tokens in order: no atomics, so the sum
// order is fixed and runs are bitwise reproducible. Cost O(V * N) token compares.
//
//   @binding(0) dims   : {N = B*T, C, V}     uniform
//   @binding(1) tokens : array<u32> [N]      read
//   @binding(2) dx     : array<f32> [N, C]   read (gradient of the embedding output)
//   @binding(3) dwte   : array<f32> [V, C]   += (tied with the LM head, which adds first)
// Dispatch: V workgroups (2-D when over 65535) of WG threads over channels.

override WG: u32 = 64u;

struct Dims { N: u32, C: u32, V: u32, pad: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> dx: array<f32>;
@group(0) @binding(3) var<storage, read_write> dwte: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let v = wid.x + wid.y * nwg.x;
  if (v >= dims.V) { return; }
  for (var c = t; c < dims.C; c = c + WG) {
    var s = 0.0;
    var hit = false;
    for (var n = 0u; n < dims.N; n = n + 1u) {
      if (tokens[n] == v) { s = s + dx[n * dims.C + c]; hit = true; }
    }
    if (hit) { dwte[v * dims.C + c] = dwte[v * dims.C + c] + s; }
  }
}
