// 05_attention: causal softmax attention, scale 1/sqrt(D), one query row per thread with a
// running max (online softmax), so exp() never overflows.
//
//   @binding(0) dims : {B, T, H, D, C, scale}          uniform
//   @binding(1) qkv  : array<f32> [B, T, 3C]           read (q, k after RoPE; v)
//   @binding(2) y    : array<f32> [B, T, C]            = softmax(q k^T * scale + mask) v
//   @binding(3) lse  : array<f32> [B, H, T]            = logsumexp of the scaled scores (backward)
// Dispatch: ceil(B*H*T / WG) workgroups (2-D when over 65535). D <= MAX_D.

//#include "lib/common.wgsl"

override WG: u32 = 64u;
// Head dim as a pipeline constant: the d-loops get constant trip counts, so the compiler can
// unroll them and keep the per-thread rows in registers instead of local memory.
override HD: u32 = 64u;
const MAX_D: u32 = 128u;

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = flat_id(gid, nwg, WG);          // over [B, H, T]
  if (e >= dims.B * dims.H * dims.T) { return; }
  let t = e % dims.T;
  let h = (e / dims.T) % dims.H;
  let b = e / (dims.T * dims.H);
  let C3 = 3u * dims.C;
  let qoff = (b * dims.T + t) * C3 + h * dims.D;
  var q: array<f32, MAX_D>;
  var acc: array<f32, MAX_D>;
  for (var d = 0u; d < HD; d = d + 1u) { q[d] = qkv[qoff + d] * dims.scale; acc[d] = 0.0; }
  var m = -3.0e38;
  var l = 0.0;
  for (var s = 0u; s <= t; s = s + 1u) {
    let koff = (b * dims.T + s) * C3 + dims.C + h * dims.D;
    var score = 0.0;
    for (var d = 0u; d < HD; d = d + 1u) { score = fma(q[d], qkv[koff + d], score); }
    let m_new = max(m, score);
    let corr = exp(m - m_new);
    let p = exp(score - m_new);
    l = l * corr + p;
    let voff = koff + dims.C;
    for (var d = 0u; d < HD; d = d + 1u) { acc[d] = acc[d] * corr + p * qkv[voff + d]; }
    m = m_new;
  }
  let yoff = (b * dims.T + t) * dims.C + h * dims.D;
  let inv = 1.0 / l;
  for (var d = 0u; d < HD; d = d + 1u) { y[yoff + d] = acc[d] * inv; }
  lse[e] = m + log(l);
}
