// The 8-bit AdamW update of 12_optimizer.wgsl (adamw_8bit_update, adamw_8bit_update_f16), included
// there: that file declares the bindings, overrides (BPW, PERSISTENT, WG8, the table sizes) and
// the helpers used here (clean4, grad_scale, pack_mirror), and documents the layouts.

var<workgroup> s_code_m: array<f32, 256>;   // dequantization maps
var<workgroup> s_code_v: array<f32, 256>;
var<workgroup> s_skip: f32;   // SKIP_NONFINITE: stats[3], read once per workgroup
var<workgroup> s_thr_m: array<f32, 256>;    // thr[j]: smallest x that rounds to code j+1 or above
var<workgroup> s_thr_v: array<f32, 256>;
var<workgroup> s_bkt_m: array<u32, BW_M>;   // bucket -> first candidate code, 4 bytes per word
var<workgroup> s_bkt_v: array<u32, BW_V>;
var<workgroup> s_red: array<vec2<f32>, WG8>;
var<workgroup> s_red2: array<vec2<f32>, BPW * 8u>;

// tables[0..QTAB_WORDS): code_m[256], code_v[256], thr_m[256], thr_v[256] (f32 bits),
// bkt_m[BW_M] (m buckets, positive then negative), bkt_v[BW_V].
fn load_qtab(lid: u32) {
  for (var i = lid; i < 256u; i += WG8) {
    s_code_m[i] = bitcast<f32>(tables[i]);
    s_code_v[i] = bitcast<f32>(tables[256u + i]);
    s_thr_m[i] = bitcast<f32>(tables[512u + i]);
    s_thr_v[i] = bitcast<f32>(tables[768u + i]);
  }
  for (var i = lid; i < BW_M; i += WG8) { s_bkt_m[i] = tables[1024u + i]; }
  for (var i = lid; i < BW_V; i += WG8) { s_bkt_v[i] = tables[1024u + BW_M + i]; }
}

// Bucket of |x|: 0 below 2^-EXP_RANGE, then (exponent, top mb mantissa bits), clamped at 1.0.
fn bucket(mag: u32, mb: u32, nk: u32) -> u32 {
  let lo = (127u - EXP_RANGE) << 23u;
  if (mag < lo) { return 0u; }
  return min((mag >> (23u - mb)) - ((127u - EXP_RANGE) << mb) + 1u, nk - 1u);
}

// Nearest code of x in [-1, 1] for the signed map (sign fix folded into the thresholds).
fn quant_m(x: f32) -> u32 {
  let bits = bitcast<u32>(x);
  let k = bucket(bits & 0x7fffffffu, MB_M, NK_M) + select(0u, NK_M, bits >= 0x80000000u);
  let base = (s_bkt_m[k >> 2u] >> ((k & 3u) << 3u)) & 0xffu;
  return base + select(0u, 1u, x >= s_thr_m[base]);
}

// Nearest code of x in [0, 1] for the unsigned map.
fn quant_v(x: f32) -> u32 {
  let k = bucket(bitcast<u32>(x) & 0x7fffffffu, MB_V, NK_V);
  let base = (s_bkt_v[k >> 2u] >> ((k & 3u) << 3u)) & 0xffu;
  return base + select(0u, 1u, x >= s_thr_v[base]);
}

fn dequant_m(word: u32, absmax: f32) -> vec4<f32> {
  return vec4<f32>(s_code_m[word & 0xffu], s_code_m[(word >> 8u) & 0xffu],
                   s_code_m[(word >> 16u) & 0xffu], s_code_m[word >> 24u]) * absmax;
}

fn dequant_v(word: u32, absmax: f32) -> vec4<f32> {
  return vec4<f32>(s_code_v[word & 0xffu], s_code_v[(word >> 8u) & 0xffu],
                   s_code_v[(word >> 16u) & 0xffu], s_code_v[word >> 24u]) * absmax;
}

fn max4(a: vec4<f32>) -> f32 {
  return max(max(a.x, a.y), max(a.z, a.w));
}

// What a thread loads for its 4 elements of block `blk` before the tables are needed, so that
// these global loads are in flight while the workgroup fills its shared tables.
struct In8 {
  e: vec4<u32>,          // block entry (start, length, slot, flags); length 0 = no block
  w: vec4<f32>, g: vec4<f32>,
  m: vec4<f32>, v: vec4<f32>,    // f32-state blocks: the state itself
  qm: u32, qv: u32,              // 8-bit blocks: the code words
  am: f32, av: f32,              // 8-bit blocks: the absmax of m and v
}

struct Out8 { w: vec4<f32>, i: u32, live: bool }

// Block entry (start, length, slot, flags), or zeros past the chunk's last block.
fn entry8(blk: u32) -> vec4<u32> {
  if (blk >= cu.b1) { return vec4<u32>(0u); }
  let o = QTAB_WORDS + 4u * blk;
  return vec4<u32>(tables[o], tables[o + 1u], tables[o + 2u], tables[o + 3u]);
}

fn load8(e: vec4<u32>, t: u32) -> In8 {
  var r: In8;
  r.e = e;
  if (4u * t < e.y) {
    let i = (e.x - cu.base) / 4u + t;
    r.w = w4[i];
    r.g = g4[i];
    if ((e.w & 1u) == 0u) {
      let cw = (e.z - cu.qbase) * 128u + t;
      r.qm = codes[cw];
      r.qv = codes[cw + 64u];
      r.am = small[2u * e.z];
      r.av = small[2u * e.z + 1u];
    } else {
      let s = 4u * t + e.z;
      r.m = vec4<f32>(small[cu.m32 + s], small[cu.m32 + s + 1u], small[cu.m32 + s + 2u], small[cu.m32 + s + 3u]);
      r.v = vec4<f32>(small[cu.v32 + s], small[cu.v32 + s + 1u], small[cu.v32 + s + 2u], small[cu.v32 + s + 3u]);
    }
  }
  return r;
}

// The update of one block by the 64 threads of group `grp` (thread t owns elements 4t..4t+3),
// from what load8 fetched; the shared tables must be loaded. Called in uniform control flow:
// it holds the barriers of the absmax reduction.
fn finish8(r: In8, t: u32, grp: u32, lid: u32) -> Out8 {
  let e = r.e;
  let live = 4u * t < e.y;
  let is8 = (e.w & 1u) == 0u;
  let i = (e.x - cu.base) / 4u + t;           // vec4 index in the W/G window
  var w = r.w;
  var m = r.m;
  var v = r.v;
  if (live) {
    let g = clean4(r.g) * grad_scale();
    if (is8) {
      m = dequant_m(r.qm, r.am);
      v = dequant_v(r.qv, r.av);
    }
    // bnb: state1.mul_(beta1).add_(g, alpha=1-beta1) (fused), state2.mul_(beta2).addcmul_(g, g, 1-beta2)
    m = fma(g, vec4<f32>(hp.omb1), m * hp.beta1);
    v = v * hp.beta2 + (hp.omb2 * g) * g;
    if (e.x < hp.decay_end) { w = w * hp.decay; }
    let step = adam_step();   // (neg_step, bc2_sqrt, q32_step, q32_eps)
    if (is8) {
      let denom = sqrt(v) / step.y + hp.eps;
      w = w + (step.x * m) / denom;
    } else {
      w = fma(m / (sqrt(v) + step.w), vec4<f32>(step.z), w);
    }
  }

  // New absmax of m and v over the block: 64 -> 8 -> 1 per group.
  s_red[lid] = select(vec2<f32>(0.0), vec2<f32>(max4(abs(m)), max4(v)), live);
  workgroupBarrier();
  if (t < 8u) {
    var a = s_red[grp * 64u + 8u * t];
    for (var k = 1u; k < 8u; k++) { a = max(a, s_red[grp * 64u + 8u * t + k]); }
    s_red2[grp * 8u + t] = a;
  }
  workgroupBarrier();
  var am = s_red2[grp * 8u];
  for (var k = 1u; k < 8u; k++) { am = max(am, s_red2[grp * 8u + k]); }

  if (live) {
    if (is8) {
      // x / absmax as x * (1 / absmax), like bnb's CPU quantizer (one division per block)
      let xm = m * select(1.0 / am.x, 0.0, am.x == 0.0);
      let xv = v * select(1.0 / am.y, 0.0, am.y == 0.0);
      let cw = (e.z - cu.qbase) * 128u + t;
      codes[cw] = quant_m(xm.x) | (quant_m(xm.y) << 8u) | (quant_m(xm.z) << 16u) | (quant_m(xm.w) << 24u);
      codes[cw + 64u] = quant_v(xv.x) | (quant_v(xv.y) << 8u) | (quant_v(xv.z) << 16u) | (quant_v(xv.w) << 24u);
      if (t == 0u) {
        small[2u * e.z] = am.x;
        small[2u * e.z + 1u] = am.y;
      }
    } else {
      let s = 4u * t + e.z;
      small[cu.m32 + s] = m.x; small[cu.m32 + s + 1u] = m.y;
      small[cu.m32 + s + 2u] = m.z; small[cu.m32 + s + 3u] = m.w;
      small[cu.v32 + s] = v.x; small[cu.v32 + s + 1u] = v.y;
      small[cu.v32 + s + 2u] = v.z; small[cu.v32 + s + 3u] = v.w;
    }
    w4[i] = w;
    g4[i] = vec4<f32>(0.0);
  }
  return Out8(w, i, live);
}

// Two schedules, chosen by PERSISTENT: one round of BPW blocks per workgroup (2-D grid; the block
// loads go out before the table loads, so their latencies overlap), or a fixed grid whose
// workgroups stride over the blocks with the tables loaded once, software-pipelined: the loads of
// round k+1 (and the entries of round k+2) are in flight while round k is computed. The two entry
// points differ only in the mirror write, so they stay two copies: WGSL passes no functions, and
// a shared loop that wrote the mirror (even under an override) would use it statically, so the
// plain 8-bit pipeline's layout would need a mirror binding with no buffer behind it.

@compute @workgroup_size(WG8)
fn adamw_8bit_update(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
  if (SKIP_NONFINITE) {
    if (lid == 0u) { s_skip = stats[3]; }
    if (workgroupUniformLoad(&s_skip) > 0.0) { return; }   // zero_skipped_grads zeroes g
  }
  let grp = lid / 64u;
  let t = lid % 64u;
  if (PERSISTENT) {
    let stride = nwg.x * BPW;
    var b = cu.b0 + wid.x * BPW;
    var cur = load8(entry8(b + grp), t);
    var ahead = entry8(b + stride + grp);
    load_qtab(lid);
    workgroupBarrier();
    for (; b < cu.b1; b += stride) {
      let next = load8(ahead, t);
      ahead = entry8(b + 2u * stride + grp);
      _ = finish8(cur, t, grp, lid);
      cur = next;
    }
  } else {
    let r = load8(entry8(cu.b0 + (wid.x + wid.y * nwg.x) * BPW + grp), t);
    load_qtab(lid);
    workgroupBarrier();
    _ = finish8(r, t, grp, lid);
  }
}

@compute @workgroup_size(WG8)
fn adamw_8bit_update_f16(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
  if (SKIP_NONFINITE) {
    if (lid == 0u) { s_skip = stats[3]; }
    if (workgroupUniformLoad(&s_skip) > 0.0) { return; }   // zero_skipped_grads zeroes g
  }
  let grp = lid / 64u;
  let t = lid % 64u;
  if (PERSISTENT) {
    let stride = nwg.x * BPW;
    var b = cu.b0 + wid.x * BPW;
    var cur = load8(entry8(b + grp), t);
    var ahead = entry8(b + stride + grp);
    load_qtab(lid);
    workgroupBarrier();
    for (; b < cu.b1; b += stride) {
      let next = load8(ahead, t);
      ahead = entry8(b + 2u * stride + grp);
      let o = finish8(cur, t, grp, lid);
      if (o.live) { mirror[o.i] = pack_mirror(o.w); }
      cur = next;
    }
  } else {
    let r = load8(entry8(cu.b0 + (wid.x + wid.y * nwg.x) * BPW + grp), t);
    load_qtab(lid);
    workgroupBarrier();
    let o = finish8(r, t, grp, lid);
    if (o.live) { mirror[o.i] = pack_mirror(o.w); }
  }
}
