// 10_attention_backward_rows: gradients of causal attention for short sequences (the tiled
// one is 10_attention_backward.wgsl), recomputing P from q, k and the saved
// logsumexp. With P_ts = exp(q_t.k_s * scale - lse_t) (s <= t), dO = dy, delta_t = dO_t . y_t:
//   dS_ts = P_ts * (dO_t . v_s - delta_t)
//   dq_t  = scale * sum_s dS_ts k_s            (attention_backward_dq, one thread per query)
//   dk_s  = scale * sum_t dS_ts q_t            (attention_backward_dkdv, one thread per key)
//   dv_s  = sum_t P_ts dO_t
// No atomics: each output row is owned by one thread, so results are deterministic. A workgroup
// takes WG consecutive rows of one (batch, head) and stages the rows they all read (keys and
// values for dq; queries, dO, lse and delta for dk/dv) in workgroup memory, KT at a time.
//
//   @binding(0) dims  : {B, T, H, D, C, scale}   uniform
//   @binding(1) qkv   : array<f32> [B, T, 3C]    read (forward's q, k after RoPE, v)
//   @binding(2) y     : array<f32> [B, T, C]     read (forward output; dq only, dkdv binds it unread)
//   @binding(3) dy    : array<f32> [B, T, C]     read
//   @binding(4) lse   : array<f32> [B, H, T]     read
//   @binding(5) delta : array<f32> [B, H, T]     dq pass: = dO.y ; dkdv pass: read
//   @binding(6) dqkv  : array<f32> [B, T, 3C]    dq pass: = dq third; dkdv pass: = dk, dv thirds
// Dispatch (both): B * H * ceil(T / WG) workgroups (2-D when over 65535). Run dq first.

//#include "lib/attention_rows.wgsl"

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<f32>;

fn row3(b: u32, t: u32) -> u32 { return (b * dims.T + t) * 3u * dims.C; }
fn row1(b: u32, t: u32) -> u32 { return (b * dims.T + t) * dims.C; }

var<workgroup> tile_a: array<vec4<f32>, KT * HV>;   // dq: keys;   dkdv: queries (scaled)
var<workgroup> tile_b: array<vec4<f32>, KT * HV>;   // dq: values; dkdv: dO rows
var<workgroup> tile_l: array<f32, KT>;              // dkdv: lse of the staged queries
var<workgroup> tile_d: array<f32, KT>;              // dkdv: delta of the staged queries

fn row_at(src: u32, i: u32) -> f32 {
  if (src == QKV) { return qkv[i]; }
  if (src == Y) { return y[i]; }
  return dy[i];
}

fn sum4(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }

// Row d4-slices back to memory: dst[o + d] for d < HD (dqkv is the only output).
fn store_row(o: u32, d4: u32, v: vec4<f32>) {
  for (var c = 0u; c < 4u; c = c + 1u) {
    if (4u * d4 + c < HD) { dqkv[o + 4u * d4 + c] = v[c]; }
  }
}

@compute @workgroup_size(WG)
fn attention_backward_dq(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg);
  if (blk.w == 0u) { return; }          // whole workgroups only: barriers stay uniform
  let b = blk.x;
  let h = blk.y;
  let t = blk.z + lid;                  // this thread's query
  let valid = t < dims.T;
  let tc = min(t, dims.T - 1u);
  let hd = h * dims.D;
  var q: array<vec4<f32>, MAX_V>;
  var g: array<vec4<f32>, MAX_V>;
  var dq: array<vec4<f32>, MAX_V>;
  var dl4 = vec4<f32>(0.0);
  for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
    q[d4] = pad4(row3(b, tc) + hd, d4, QKV) * dims.scale;
    g[d4] = pad4(row1(b, tc) + hd, d4, DY);
    dl4 = fma(g[d4], pad4(row1(b, tc) + hd, d4, Y), dl4);
    dq[d4] = vec4<f32>(0.0);
  }
  let dl = sum4(dl4);
  let e = (b * dims.H + h) * dims.T + tc;
  if (valid) { delta[e] = dl; }
  let l = lse[e];
  let keys = min(dims.T, blk.z + WG);   // the block's last query sees keys [0, keys)
  for (var s0 = 0u; s0 < keys; s0 = s0 + KT) {
    for (var i = lid; i < KT * HV; i = i + WG) {
      let koff = row3(b, min(s0 + i / HV, dims.T - 1u)) + dims.C + hd;
      tile_a[i] = pad4(koff, i % HV, QKV);
      tile_b[i] = pad4(koff + dims.C, i % HV, QKV);
    }
    workgroupBarrier();
    let n = select(0u, min(KT, t + 1u - s0), valid && t >= s0);   // keys s0 + j <= t
    for (var j = 0u; j < n; j = j + 1u) {
      var score = vec4<f32>(0.0);
      var dp = vec4<f32>(0.0);
      for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
        score = fma(q[d4], tile_a[j * HV + d4], score);
        dp = fma(g[d4], tile_b[j * HV + d4], dp);
      }
      let ds = exp(sum4(score) - l) * (sum4(dp) - dl);
      for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
        dq[d4] = fma(vec4<f32>(ds), tile_a[j * HV + d4], dq[d4]);
      }
    }
    workgroupBarrier();
  }
  if (!valid) { return; }
  for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) { store_row(row3(b, t) + hd, d4, dq[d4] * dims.scale); }
}

@compute @workgroup_size(WG)
fn attention_backward_dkdv(@builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg);
  if (blk.w == 0u) { return; }
  let b = blk.x;
  let h = blk.y;
  let s = blk.z + lid;                  // this thread's key
  let valid = s < dims.T;
  let sc = min(s, dims.T - 1u);
  let hd = h * dims.D;
  var k: array<vec4<f32>, MAX_V>;
  var v: array<vec4<f32>, MAX_V>;
  var dk: array<vec4<f32>, MAX_V>;
  var dv: array<vec4<f32>, MAX_V>;
  for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
    k[d4] = pad4(row3(b, sc) + dims.C + hd, d4, QKV);
    v[d4] = pad4(row3(b, sc) + 2u * dims.C + hd, d4, QKV);
    dk[d4] = vec4<f32>(0.0);
    dv[d4] = vec4<f32>(0.0);
  }
  let hrow = (b * dims.H + h) * dims.T;
  for (var t0 = blk.z; t0 < dims.T; t0 = t0 + KT) {   // queries t >= the block's first key
    for (var i = lid; i < KT * HV; i = i + WG) {
      let tt = min(t0 + i / HV, dims.T - 1u);
      tile_a[i] = pad4(row3(b, tt) + hd, i % HV, QKV) * dims.scale;
      tile_b[i] = pad4(row1(b, tt) + hd, i % HV, DY);
    }
    for (var i = lid; i < KT; i = i + WG) {
      let tt = min(t0 + i, dims.T - 1u);
      tile_l[i] = lse[hrow + tt];
      tile_d[i] = delta[hrow + tt];
    }
    workgroupBarrier();
    let end = min(KT, dims.T - t0);
    let begin = select(min(s - t0, end), 0u, s <= t0);   // queries t0 + j >= s
    for (var j = select(end, begin, valid); j < end; j = j + 1u) {
      var score = vec4<f32>(0.0);
      var dp = vec4<f32>(0.0);
      for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
        score = fma(tile_a[j * HV + d4], k[d4], score);
        dp = fma(tile_b[j * HV + d4], v[d4], dp);
      }
      let p = exp(sum4(score) - tile_l[j]);
      let ds = p * (sum4(dp) - tile_d[j]);
      for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
        dv[d4] = fma(vec4<f32>(p), tile_b[j * HV + d4], dv[d4]);
        dk[d4] = fma(vec4<f32>(ds), tile_a[j * HV + d4], dk[d4]);
      }
    }
    workgroupBarrier();
  }
  if (!valid) { return; }
  for (var d4 = 0u; d4 < HV; d4 = d4 + 1u) {
    store_row(row3(b, s) + dims.C + hd, d4, dk[d4]);   // the staged queries carry the scale
    store_row(row3(b, s) + 2u * dims.C + hd, d4, dv[d4]);
  }
}
