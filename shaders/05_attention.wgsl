// 05_attention: causal softmax attention, scale 1/sqrt(D), one query row per thread with a
// running max (online softmax), so exp() never overflows. A workgroup takes WG consecutive
// queries of one (batch, head) and walks the keys they need in tiles of KT, staged once in
// workgroup memory for all its threads.
//
//   @binding(0) dims : {B, T, H, D, C, scale}          uniform
//   @binding(1) qkv  : array<f32> [B, T, 3C]           read (q, k after RoPE; v)
//   @binding(2) y    : array<f32> [B, T, C]            = softmax(q k^T * scale + mask) v
//   @binding(3) lse  : array<f32> [B, H, T]            = logsumexp of the scaled scores (backward)
// Dispatch: B * H * ceil(T / WG) workgroups (2-D when over 65535). D <= MAX_D.

//#include "lib/attention.wgsl"

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

var<workgroup> tile_k: array<f32, KT * HD>;   // [KT, HD] keys s0 .. s0 + KT
var<workgroup> tile_v: array<f32, KT * HD>;   // [KT, HD] their values

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
  var q: array<f32, MAX_D>;
  var acc: array<f32, MAX_D>;
  let qoff = (b * dims.T + min(t, dims.T - 1u)) * C3 + h * dims.D;
  for (var d = 0u; d < HD; d = d + 1u) { q[d] = qkv[qoff + d] * dims.scale; acc[d] = 0.0; }
  var m = -3.0e38;
  var l = 0.0;
  let keys = min(dims.T, blk.z + WG);   // the block's last query sees keys [0, keys)
  for (var s0 = 0u; s0 < keys; s0 = s0 + KT) {
    for (var i = lid; i < KT * HD; i = i + WG) {
      let s = s0 + i / HD;
      let koff = (b * dims.T + min(s, dims.T - 1u)) * C3 + dims.C + h * dims.D + i % HD;
      tile_k[i] = qkv[koff];
      tile_v[i] = qkv[koff + dims.C];
    }
    workgroupBarrier();
    // Keys s0 + j <= t of this tile (none when the tile starts after t).
    let n = select(0u, min(KT, t + 1u - s0), valid && t >= s0);
    for (var j = 0u; j < n; j = j + 1u) {
      var score = 0.0;
      for (var d = 0u; d < HD; d = d + 1u) { score = fma(q[d], tile_k[j * HD + d], score); }
      let m_new = max(m, score);
      let corr = exp(m - m_new);
      let p = exp(score - m_new);
      l = l * corr + p;
      for (var d = 0u; d < HD; d = d + 1u) { acc[d] = acc[d] * corr + p * tile_v[j * HD + d]; }
      m = m_new;
    }
    workgroupBarrier();
  }
  if (!valid) { return; }
  let yoff = (b * dims.T + t) * dims.C + h * dims.D;
  let inv = 1.0 / l;
  for (var d = 0u; d < HD; d = d + 1u) { y[yoff + d] = acc[d] * inv; }
  lse[(b * dims.H + h) * dims.T + t] = m + log(l);
}
