// 10_attention_backward: gradients of causal attention, recomputing P from q, k and the saved
// logsumexp. With P_ts = exp(q_t.k_s * scale - lse_t) (s <= t), dO = dy, delta_t = dO_t . y_t:
//   dS_ts = P_ts * (dO_t . v_s - delta_t)
//   dq_t  = scale * sum_s dS_ts k_s            (attention_backward_dq, one thread per query)
//   dk_s  = scale * sum_t dS_ts q_t            (attention_backward_dkdv, one thread per key)
//   dv_s  = sum_t P_ts dO_t
// No atomics: each output row is owned by one thread, so results are deterministic.
//
//   @binding(0) dims  : {B, T, H, D, C, scale}   uniform
//   @binding(1) qkv   : array<f32> [B, T, 3C]    read (forward's q, k after RoPE, v)
//   @binding(2) y     : array<f32> [B, T, C]     read (forward output)
//   @binding(3) dy    : array<f32> [B, T, C]     read
//   @binding(4) lse   : array<f32> [B, H, T]     read
//   @binding(5) delta : array<f32> [B, H, T]     dq pass: = dO.y ; dkdv pass: read
//   @binding(6) dqkv  : array<f32> [B, T, 3C]    dq pass: = dq third; dkdv pass: = dk, dv thirds
// Dispatch (both): ceil(B*H*T / WG) workgroups (2-D when over 65535). Run dq first.

//#include "lib/common.wgsl"

override WG: u32 = 64u;
// Head dim as a pipeline constant: the d-loops get constant trip counts, so the compiler can
// unroll them and keep the per-thread rows in registers instead of local memory.
override HD: u32 = 64u;
const MAX_D: u32 = 128u;

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<f32>;

fn row3(b: u32, t: u32) -> u32 { return (b * dims.T + t) * 3u * dims.C; }
fn row1(b: u32, t: u32) -> u32 { return (b * dims.T + t) * dims.C; }

@compute @workgroup_size(WG)
fn attention_backward_dq(@builtin(global_invocation_id) gid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = flat_id(gid, nwg, WG);          // over [B, H, T]
  if (e >= dims.B * dims.H * dims.T) { return; }
  let t = e % dims.T;
  let h = (e / dims.T) % dims.H;
  let b = e / (dims.T * dims.H);
  let hd = h * dims.D;
  var q: array<f32, MAX_D>;
  var g: array<f32, MAX_D>;
  var dq: array<f32, MAX_D>;
  var dl = 0.0;
  for (var d = 0u; d < HD; d = d + 1u) {
    q[d] = qkv[row3(b, t) + hd + d] * dims.scale;
    g[d] = dy[row1(b, t) + hd + d];
    dl = fma(g[d], y[row1(b, t) + hd + d], dl);
    dq[d] = 0.0;
  }
  delta[e] = dl;
  let l = lse[e];
  for (var s = 0u; s <= t; s = s + 1u) {
    let koff = row3(b, s) + dims.C + hd;
    let voff = koff + dims.C;
    var score = 0.0;
    var dp = 0.0;
    for (var d = 0u; d < HD; d = d + 1u) {
      score = fma(q[d], qkv[koff + d], score);
      dp = fma(g[d], qkv[voff + d], dp);
    }
    let ds = exp(score - l) * (dp - dl);
    for (var d = 0u; d < HD; d = d + 1u) { dq[d] = fma(ds, qkv[koff + d], dq[d]); }
  }
  for (var d = 0u; d < HD; d = d + 1u) { dqkv[row3(b, t) + hd + d] = dq[d] * dims.scale; }
}

@compute @workgroup_size(WG)
fn attention_backward_dkdv(@builtin(global_invocation_id) gid: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
  let e = flat_id(gid, nwg, WG);          // over [B, H, T], here s is the key position
  if (e >= dims.B * dims.H * dims.T) { return; }
  let s = e % dims.T;
  let h = (e / dims.T) % dims.H;
  let b = e / (dims.T * dims.H);
  let hd = h * dims.D;
  var k: array<f32, MAX_D>;
  var v: array<f32, MAX_D>;
  var dk: array<f32, MAX_D>;
  var dv: array<f32, MAX_D>;
  for (var d = 0u; d < HD; d = d + 1u) {
    k[d] = qkv[row3(b, s) + dims.C + hd + d] * dims.scale;
    v[d] = qkv[row3(b, s) + 2u * dims.C + hd + d];
    dk[d] = 0.0;
    dv[d] = 0.0;
  }
  let hrow = (b * dims.H + h) * dims.T;
  // All threads of the workgroup walk the same query rows t in step (from the workgroup's first
  // key), so each row is one broadcast read, not 64 scattered ones; t < s is skipped.
  for (var t = s - min(s, lid); t < dims.T; t = t + 1u) {
    if (t < s) { continue; }
    let qoff = row3(b, t) + hd;
    let goff = row1(b, t) + hd;
    var score = 0.0;
    var dp = 0.0;
    for (var d = 0u; d < HD; d = d + 1u) {
      score = fma(qkv[qoff + d], k[d], score);
      dp = fma(dy[goff + d], v[d], dp);
    }
    let p = exp(score - lse[hrow + t]);
    let ds = p * (dp - delta[hrow + t]);
    for (var d = 0u; d < HD; d = d + 1u) {
      dv[d] = fma(p, dy[goff + d], dv[d]);
      dk[d] = fma(ds, qkv[qoff + d], dk[d]);
    }
  }
  for (var d = 0u; d < HD; d = d + 1u) {
    dqkv[row3(b, s) + dims.C + hd + d] = dk[d] * dims.scale;
    dqkv[row3(b, s) + 2u * dims.C + hd + d] = dv[d];
  }
}
