// 01_embed: token embedding lookup.
//
// Bindings:
//   @binding(0) dims   : {N = B*T rows, C}        uniform
//   @binding(1) tokens : array<u32>  [B*T]        read
//   @binding(2) wte    : array<f32>  [V, C]       read (model.embed_tokens.weight)
//   @binding(3) x      : array<f32>  [B*T, C]     = wte[tokens[n], :]
// Dispatch: ceil(N*C / WG) workgroups (2-D when over 65535), WG threads.

//#include "lib/common.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

struct Dims { N: u32, C: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> wte: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = flat_id(gid, nwg, WG);
  if (e >= dims.N * dims.C) { return; }
  let n = e / dims.C;
  let c = e % dims.C;
  x[e] = wte[tokens[n] * dims.C + c];
}
