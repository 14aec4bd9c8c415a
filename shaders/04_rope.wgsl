// 04_rope: rotary position embedding on q and k, in place, Hugging Face "rotate_half"
// convention: within each head, element j pairs with j + D/2 (j < D/2).
//   forward:  a' = a cos - b sin,  b' = b cos + a sin      (a = x[j], b = x[j + D/2])
//   backward (INVERSE): the transpose rotation, a' = a cos + b sin, b' = b cos - a sin
// cos/sin come from a host-computed table [T, D/2] (f32 angles as HF computes them), so no
// large-argument GPU cos() enters the result.
//
//   @binding(0) dims : {N = B*T, T, H, D, C}          uniform
//   @binding(1) qkv  : array<f32> [N, 3C]              q at [0, C), k at [C, 2C): in place (=)
//   @binding(2) cs   : array<f32> [T, D/2, 2]          read (cos, sin)
// Dispatch: ceil(N * 2 * H * D/2 / WG) workgroups (2-D when over 65535).

//#include "lib/common.wgsl"

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it
override INVERSE: bool = false;

struct Dims { N: u32, T: u32, H: u32, D: u32, C: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let half = dims.D / 2u;
  let e = flat_id(gid, nwg, WG);          // over [N, 2 (q|k), H, D/2]
  if (e >= dims.N * 2u * dims.H * half) { return; }
  let j = e % half;
  let h = (e / half) % dims.H;
  let which = (e / (half * dims.H)) % 2u;
  let n = e / (half * dims.H * 2u);
  let t = n % dims.T;
  let base = n * 3u * dims.C + which * dims.C + h * dims.D;
  let c = cs[(t * half + j) * 2u];
  var s = cs[(t * half + j) * 2u + 1u];
  if (INVERSE) { s = -s; }
  let a = qkv[base + j];
  let b = qkv[base + j + half];
  qkv[base + j] = a * c - b * s;
  qkv[base + j + half] = b * c + a * s;
}
