// 05_attention_rows: causal softmax attention for short sequences (kernels.js picks it below
// ATTENTION_TILED_T; 05_attention.wgsl is the tiled one), scale 1/sqrt(D), one query row per thread with a
// running max (online softmax), so exp() never overflows. A workgroup takes WG consecutive
// queries of one (batch, head) and walks the keys they need in tiles of KT, staged once in
// workgroup memory for all its threads.
//
//   @binding(0) dims : {B, T, H, D, C, scale}          uniform
//   @binding(1) qkv  : array<f32> [B, T, 3C]           read (q, k after RoPE; v)
//   @binding(2) y    : array<f32> [B, T, C]            = softmax(q k^T * scale + mask) v
//   @binding(3) lse  : array<f32> [B, H, T]            = logsumexp of the scaled scores (backward)
// Dispatch: B * H * ceil(T / WG) workgroups (2-D when over 65535). D <= MAX_D.

//#include "lib/attention_rows.wgsl"

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

var<workgroup> tile_k: array<vec4<f32>, KT * HV>;   // [KT, HV] keys s0 .. s0 + KT
var<workgroup> tile_v: array<vec4<f32>, KT * HV>;   // [KT, HV] their values

fn row_at(src: u32, i: u32) -> f32 { return qkv[i]; }   // the forward reads qkv only

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg);
  if (blk.w == 0u) { return; }          // whole workgroups only: barriers stay uniform
  let b = blk.x;
  let h = blk.y;
  let t = blk.z + lid;                  // this thread's query
  let valid = t < dims.T;
  let C3 = 3u * dims.C;
  var q: array<vec4<f32>, MAX_V>;
  var acc: array<vec4<f32>, MAX_V>;
  let qoff = (b * dims.T + min(t, dims.T - 1u)) * C3 + h * dims.D;
  for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
    q[d4] = pad4(qoff, d4, QKV) * dims.scale;
    acc[d4] = vec4<f32>(0.0);
  }
  var m = -3.0e38;
  var l = 0.0;
  let keys = min(dims.T, blk.z + WG);   // the block's last query sees keys [0, keys)
  for (var s0 = 0u; s0 < keys; s0 = s0 + KT) {
    for (var i = lid; i < KT * HV; i = i + WG) {
      let koff = (b * dims.T + min(s0 + i / HV, dims.T - 1u)) * C3 + dims.C + h * dims.D;
      tile_k[i] = pad4(koff, i % HV, QKV);
      tile_v[i] = pad4(koff + dims.C, i % HV, QKV);
    }
    workgroupBarrier();
    // Keys s0 + j <= t of this tile (none when the tile starts after t).
    let n = select(0u, min(KT, t + 1u - s0), valid && t >= s0);
    for (var j = 0u; j < n; j = j + 1u) {
      var part = vec4<f32>(0.0);
      for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) { part = fma(q[d4], tile_k[j * HV + d4], part); }
      let score = (part.x + part.y) + (part.z + part.w);
      let m_new = max(m, score);
      let corr = exp(m - m_new);
      let p = exp(score - m_new);
      l = l * corr + p;
      for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
        acc[d4] = fma(vec4<f32>(p), tile_v[j * HV + d4], acc[d4] * corr);
      }
      m = m_new;
    }
    workgroupBarrier();
  }
  if (!valid) { return; }
  let yoff = (b * dims.T + t) * dims.C + h * dims.D;
  let inv = 1.0 / l;
  for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
    let a = acc[d4] * inv;
    for (var c = 0u; c < 4u; c = c + 1u) {
      if (4u * d4 + c < HD) { y[yoff + 4u * d4 + c] = a[c]; }
    }
  }
  lse[(b * dims.H + h) * dims.T + t] = m + log(l);
}
