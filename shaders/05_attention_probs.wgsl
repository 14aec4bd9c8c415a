// 05_attention_probs: the attention probabilities of a forward, for the attention maps (a view,
// never part of a training step): P[b, h, i, j] = exp(q_i . k_j * scale - lse[b, h, i]) for
// j <= i, 0 above the diagonal. The lse is the forward's own (05_attention), so each row is the
// softmax that forward used, and sums to 1 up to rounding.
//
//   @binding(0) dims  : {B, T, H, D, C, scale}       uniform (lib/attention.wgsl's Dims)
//   @binding(1) qkv   : array<f32> [B, T, 3C]        read (q, k after RoPE; v unused)
//   @binding(2) lse   : array<f32> [B, H, T]         read
//   @binding(3) probs : array<f32> [B, H, T, T]      written
// Dispatch: grid1d(ceil(B H T T / WG)) workgroups, one thread per probability.

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }
override WG: u32;

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> lse: array<f32>;
@group(0) @binding(3) var<storage, read_write> probs: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let T = dims.T;
  let e = gid.x + gid.y * nwg.x * WG;
  if (e >= dims.B * dims.H * T * T) { return; }
  let j = e % T;
  let i = (e / T) % T;
  let bh = e / (T * T);              // b * H + h
  let h = bh % dims.H;
  let b = bh / dims.H;
  if (j > i) { probs[e] = 0.0; return; }
  let row = 3u * dims.C;
  let q = (b * T + i) * row + h * dims.D;
  let k = (b * T + j) * row + dims.C + h * dims.D;
  var s = 0.0;
  for (var d = 0u; d < dims.D; d = d + 1u) { s = s + qkv[q + d] * qkv[k + d]; }
  probs[e] = exp(s * dims.scale - lse[bh * T + i]);
}
