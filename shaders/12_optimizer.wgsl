// 12_optimizer: global gradient norm and clip scale, then AdamW over the multi-tensor mega-buffer,
// in three flavours: fp32 state, fp32 state + f16 weight mirror, bitsandbytes-style 8-bit state.
// The launcher is static/js/engine/optimizer.js; the 8-bit tables come from optimizer_tables.js.
//
// Legend: N = layout.total_numel (a multiple of 64), decay block [0, decay_end), no-decay block
// [decay_end, N). W, G, M, V are f32 [N] viewed as vec4 [N/4]. A dispatch sees one "chunk" of them
// through sub-range bindings starting at element cu.base (one chunk covers all of N unless a binding
// would exceed maxStorageBufferBindingSize). Non-finite gradient elements (NaN, +-Inf) count as 0
// everywhere: skipped in the norm, 0 in the update. Clipping runs before the moments see the
// gradient, so a spike never enters m and v. Step order within one compute pass (optimizer.js
// encodeNorm, encodeUpdate; the bracketed passes only where their mode is on):
//   [unscale_grads (mixed: loss scaling), per chunk] -> reduce_norm_sq (per chunk)
//   -> finalize_tensor_stats (a workgroup per tensor) -> finalize_grad_stats (1 workgroup)
//   -> [scale_tensor_grads (clip_mode per_tensor), per chunk] -> adamw_update* (per chunk)
//   -> [zero_skipped_grads, update_loss_scale (mixed)]
//
// Norm segments: every parameter tensor's range [offset, offset + numel) cut at multiples of
// P = 4*VPT*WG_R elements (the host's table, optimizer.js normSegments). A segment never straddles
// a tensor or a window (windows are whole multiples of P), so its partial sum covers the same
// elements however the bindings are split: every norm is bitwise reproducible (no atomics, no
// float CAS). Padding between tensors is in no segment (it is zero).
//
// reduce_norm_sq
//   @binding(1) cu       : Chunk                    uniform (segments [pbase, pbase + nseg))
//   @binding(12) segs    : vec4<u32> [S]            (start element, end element, tensor, 0)
//   @binding(5) g4       : vec4<f32> [n4]           read (declared read_write: the update zeroes it)
//   @binding(3) partials : vec2<f32> [S]            [s] = (sum of finite g^2, #non-finite) of segment s
//   Dispatch: 2-D, one workgroup per segment of the window. Thread t sums the segment's vec4s
//   k*WG_R + t, k = 0..VPT-1, in order (lanes outside the segment masked), then a fixed tree.
//
// finalize_tensor_stats
//   @binding(13) tsegs   : vec4<u32> [T]            (first segment, end segment, 0, 0) per tensor
//   @binding(3) partials : vec2<f32> [S]            read
//   @binding(2) stats    : f32 [4 + 4T]             [4 + 4t] = tensor t's sum of finite g^2, [+1] its
//                                                   #non-finite
//   Dispatch: (T, 1, 1), WG_F threads per tensor; its partials summed in a fixed order.
//
// finalize_grad_stats
//   @binding(0) hp       : Hyper                    uniform (max_norm, clip_mode)
//   @binding(2) stats    : f32 [4 + 4T]             reads the tensor sums; writes
//                                                   [0, 4) = (norm, clip_scale, norm^2, #non-finite),
//                                                   [4 + 4t + 2] = tensor t's clip scale
//   Dispatch: (1, 1, 1), WG_F threads; tensor sums added in a fixed order (so norm^2 is their sum).
//   Clip scales as torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)).
//   clip_mode CLIP_GLOBAL: clip_scale from the global norm, every tensor's scale 1.
//   CLIP_PER_TENSOR: each tensor's scale from its own norm (clip_grad_norm_ called once per
//   tensor); clip_scale = the smallest of them (what the record shows). CLIP_OFF: all 1.
//
// scale_tensor_grads (CLIP_PER_TENSOR only; torch's in-place g.mul_(clip_coef) per tensor)
//   @binding(1) cu, (12) segs, (2) stats, (5) g4: g *= its tensor's scale, segment by segment
//   Dispatch: as reduce_norm_sq.

// adamw_update (torch.optim.AdamW, single-tensor path, same arithmetic order)
//   @binding(0) hp : Hyper  uniform     @binding(1) cu : Chunk  uniform
//   @binding(2) stats : f32 [4 + 4T]  read (clip_scale, applied here with CLIP_GLOBAL only)
//   @binding(4) w4, (5) g4, (6) m4, (7) v4 : vec4<f32> [n4]   w, m, v = updated; g = 0
//   Dispatch: 2-D (nx, ny) workgroups of WG threads, nx * ny * WG >= n4; one vec4 per thread
//   (index flat_id(gid, nwg, WG) from lib/common.wgsl).
//   g = finite(g) * grad_scale(); w *= 1 - lr*wd (decay block only); m = lerp(m, g, 1-b1);
//   v = v*b2 + (1-b2)*g*g; w += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps); bc = 1 - beta^t (host f64).
//
// adamw_update_f16: adamw_update, plus
//   @binding(8) mirror : vec2<u32> [n4]   = pack2x16float of the new w (element i is half i%2 of
//   u32 i/2, low half first): the f16 copy of W that matmuls read; no separate cast pass exists.
//
// adamw_8bit_update (bitsandbytes AdamW8bit semantics; bnb's CPU formulas, nearest-code rounding)
//   @binding(0) hp, (1) cu, (2) stats, (4) w4, (5) g4 as above (W windowed at cu.base)
//   @binding(9)  codes  : u32 [128 per 8-bit block]   words [64q, 64q+64): m codes of block q,
//                words [64q+64, 64q+128): v codes; element j of the block is byte j%4 (little-endian)
//                of word j/4 of each half. Windowed: word 0 is block cu.qbase.
//   @binding(10) small  : f32 [A + 2F], A = 2Q rounded up to 4: [2q], [2q+1] = absmax of m, v of block q;
//                [cu.m32 + s], [cu.v32 + s] = f32 m and v of small tensors (numel < 4096)
//   @binding(11) tables : u32 [QTAB_WORDS + 4*NB]    quantization tables (see load_qtab), then the
//                block table: (start element, length, slot, flags) per block; flags bit 0 = f32
//                state (slot = offset in the f32 planes), else slot = 8-bit block q.
//   Dispatch: workgroups of 64*BPW threads; each group of 64 threads takes one block (4 elements
//   per thread). PERSISTENT (default): (nwg8, 1, 1) workgroups stride over [cu.b0, cu.b1), the next
//   round's loads in flight during this one; else one round per workgroup, 2-D grid of
//   ceil(blocks / BPW). Per block: decode m, v (code * absmax), update in f32, reduce the new
//   absmax over the block, requantize by the nearest code of x * (1 / absmax) (ties to the lower
//   code; a negative m never becomes the 0.0 code: bnb's sign fix), write codes, absmax, w, g = 0.
//   8-bit blocks: w *= 1 - lr*wd; w += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps) (bnb's 8-bit CPU op).
//   f32-state blocks (bnb's 32-bit op): w += (-lr*sqrt(bc2)/bc1) * m / (sqrt(v) + eps*sqrt(bc2)).
//   Both: m = m*b1 + (1-b1)*g (fused), v = v*b2 + (1-b2)*g*g.

// adamw_8bit_update_f16: adamw_8bit_update, plus @binding(8) mirror as in adamw_update_f16.
//
// Dynamic loss scaling (mixed precision; torch.amp.GradScaler's rule, kept on the GPU so that no
// step waits for a readback). The loss gradient was multiplied by the scale (07_loss.wgsl
// scale_dlogits); the step order becomes
//   unscale_grads -> reduce_norm_sq ... -> bias_correct -> adamw_update* (SKIP_NONFINITE)
//   -> zero_skipped_grads -> update_loss_scale
//   @binding(14) scaler : f32 [4]   (scale, clean steps since it last changed, applied steps, 0):
//                         the loss scaling's state, part of a mixed run's checkpoint
//   @binding(2) stats   : f32 [4 + 4T + 8]: the tail [4 + 4T] = the scale this step used,
//                         [+1] = 1 when the step was skipped, [+2..+5] this step's bias-corrected
//                         neg_step, bc2_sqrt, q32_step, q32_eps (bias_correct), [+6, +7] 0
// bias_correct (1 thread): Adam's bias corrections 1 - beta^t for t = the applied steps + 1, as
//   torch's AdamW under GradScaler counts them (a skipped step is no step of the optimizer's);
//   the host cannot know t when it writes hp (the skip is decided on the GPU), so with
//   SKIP_NONFINITE the update entry points take these four from the tail, not from hp.
// unscale_grads (per chunk, as adamw_update): g *= 1 / scale (a power of two: exact).
// SKIP_NONFINITE: the update entry points leave W, M, V (and the 8-bit state) as they are when
//   the step's gradient has a non-finite element (stats[3] > 0); zero_skipped_grads then zeroes
//   G, which the update would have. update_loss_scale (1 thread): records the tail, then halves
//   the scale on a skipped step, else doubles it after GROWTH clean steps in a row.

override WG: u32 = 256u;     // adamw_update threads per workgroup
override WG_R: u32 = 256u;   // reduce_norm_sq threads per workgroup (power of two)
override VPT: u32 = 16u;     // reduce_norm_sq vec4s per thread
override WG_F: u32 = 256u;   // finalize_grad_stats threads (power of two)
override BPW: u32 = 4u;      // 8-bit: blocks in flight per workgroup (64 threads each)
override PERSISTENT: bool = true;    // 8-bit schedule: strided loop, or one round per workgroup
override WG8: u32 = 64u * BPW;
// 8-bit quantization tables (see optimizer_tables.js): magnitude buckets keyed by the f32 exponent
// and the top MB mantissa bits over [2^-EXP_RANGE, 1]; one bucket below, one for 1.0 and above.
override EXP_RANGE: u32 = 24u;
override MB_M: u32 = 6u;
override MB_V: u32 = 7u;
override NK_M: u32 = (EXP_RANGE << MB_M) + 2u;   // buckets per sign for m
override NK_V: u32 = (EXP_RANGE << MB_V) + 2u;   // buckets for v (v >= 0)
override BW_M: u32 = (2u * NK_M + 3u) / 4u;      // words of packed m buckets (both signs)
override BW_V: u32 = (NK_V + 3u) / 4u;
override QTAB_WORDS: u32 = 1024u + BW_M + BW_V;
override SKIP_NONFINITE: bool = false;   // mixed precision: a non-finite gradient skips the step
override GROWTH: u32 = 2000u;            // clean steps before the loss scale doubles

struct Hyper {
  beta1: f32, beta2: f32, omb1: f32, omb2: f32,          // omb = 1 - beta, rounded once from f64
  eps: f32, decay: f32, neg_step: f32, bc2_sqrt: f32,    // decay = 1 - lr*wd, neg_step = -lr/bc1
  max_norm: f32, clip_mode: u32, decay_end: u32, lr: f32,
  q32_step: f32, q32_eps: f32, _p0: f32, _p1: f32,       // bnb f32 state: -lr*sqrt(bc2)/bc1, eps*sqrt(bc2)
}

const CLIP_OFF = 0u;
const CLIP_GLOBAL = 1u;
const CLIP_PER_TENSOR = 2u;

struct Chunk {
  base: u32, n4: u32, pbase: u32, nseg: u32,  // element window start; vec4s in window; segments
  b0: u32, b1: u32, qbase: u32, _p1: u32,     // 8-bit: block range, first 8-bit block in the codes window
  m32: u32, v32: u32, _p2: u32, _p3: u32,     // 8-bit: f32-state planes in `small`
}

@group(0) @binding(0) var<uniform> hp: Hyper;
@group(0) @binding(1) var<uniform> cu: Chunk;
@group(0) @binding(2) var<storage, read_write> stats: array<f32>;
@group(0) @binding(3) var<storage, read_write> partials: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> w4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> g4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> m4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> v4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> mirror: array<vec2<u32>>;
@group(0) @binding(9) var<storage, read_write> codes: array<u32>;
@group(0) @binding(10) var<storage, read_write> small: array<f32>;
@group(0) @binding(11) var<storage, read> tables: array<u32>;
@group(0) @binding(12) var<storage, read> segs: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read> tsegs: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read_write> scaler: array<f32>;

//#include "lib/common.wgsl"

// WGSL has no isnan/isinf; the exponent bits are all ones exactly for NaN and +-Inf.
fn finite4(g: vec4<f32>) -> vec4<bool> {
  return (bitcast<vec4<u32>>(g) & vec4<u32>(0x7f800000u)) != vec4<u32>(0x7f800000u);
}

fn clean4(g: vec4<f32>) -> vec4<f32> {
  return select(vec4<f32>(0.0), g, finite4(g));
}

fn pack_mirror(w: vec4<f32>) -> vec2<u32> {
  return vec2<u32>(pack2x16float(w.xy), pack2x16float(w.zw));
}

// ---------------------------------------------------------------- gradient norms and clip scales

// The multiplier the update applies to g: the global clip scale in CLIP_GLOBAL; 1 otherwise
// (per-tensor scales were applied to G by scale_tensor_grads).
fn grad_scale() -> f32 {
  return select(1.0, stats[1], hp.clip_mode == CLIP_GLOBAL);
}

// Lanes of vec4 `i4` (absolute) inside [start, end).
fn lanes_in(i4: u32, start: u32, end: u32) -> vec4<bool> {
  let e = vec4<u32>(4u * i4) + vec4<u32>(0u, 1u, 2u, 3u);
  return (e >= vec4<u32>(start)) & (e < vec4<u32>(end));
}

var<workgroup> red_r: array<vec2<f32>, WG_R>;

@compute @workgroup_size(WG_R)
fn reduce_norm_sq(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  if (w >= cu.nseg) { return; }   // uniform per workgroup: the barriers below stay uniform
  let seg = segs[cu.pbase + w];
  let first4 = seg.x / 4u;
  let end4 = (seg.y + 3u) / 4u;
  let win4 = cu.base / 4u;
  var sum = 0.0;
  var bad = 0u;
  for (var k = 0u; k < VPT; k++) {
    let i4 = first4 + k * WG_R + lid;
    if (i4 < end4) {
      let g = g4[i4 - win4];
      let inside = lanes_in(i4, seg.x, seg.y);
      let ok = finite4(g) & inside;
      let c = select(vec4<f32>(0.0), g, ok);
      sum += dot(c, c);
      let nonfinite = inside & !finite4(g);
      bad += dot(select(vec4<u32>(0u), vec4<u32>(1u), nonfinite), vec4<u32>(1u));
    }
  }
  red_r[lid] = vec2<f32>(sum, f32(bad));
  workgroupBarrier();
  for (var s = WG_R / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { red_r[lid] += red_r[lid + s]; }
    workgroupBarrier();
  }
  if (lid == 0u) { partials[cu.pbase + w] = red_r[0]; }
}

var<workgroup> red_f: array<vec2<f32>, WG_F>;

@compute @workgroup_size(WG_F)
fn finalize_tensor_stats(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  let range = tsegs[t];
  var acc = vec2<f32>(0.0);
  for (var i = range.x + lid; i < range.y; i += WG_F) { acc += partials[i]; }
  red_f[lid] = acc;
  workgroupBarrier();
  for (var s = WG_F / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { red_f[lid] += red_f[lid + s]; }
    workgroupBarrier();
  }
  if (lid == 0u) {
    stats[4u + 4u * t] = red_f[0].x;
    stats[5u + 4u * t] = red_f[0].y;
  }
}

fn clip_coef(norm: f32) -> f32 {
  return min(1.0, hp.max_norm / (norm + 1e-6));
}

var<workgroup> red_c: array<f32, WG_F>;

@compute @workgroup_size(WG_F)
fn finalize_grad_stats(@builtin(local_invocation_index) lid: u32) {
  let nt = arrayLength(&tsegs);
  let per_tensor = hp.clip_mode == CLIP_PER_TENSOR && hp.max_norm > 0.0;
  var acc = vec2<f32>(0.0);
  var low = 1.0;
  for (var t = lid; t < nt; t += WG_F) {
    let sq = stats[4u + 4u * t];
    acc += vec2<f32>(sq, stats[5u + 4u * t]);
    var c = 1.0;
    if (per_tensor) { c = clip_coef(sqrt(sq)); }
    stats[6u + 4u * t] = c;
    low = min(low, c);
  }
  red_f[lid] = acc;
  red_c[lid] = low;
  workgroupBarrier();
  for (var s = WG_F / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      red_f[lid] += red_f[lid + s];
      red_c[lid] = min(red_c[lid], red_c[lid + s]);
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let norm_sq = red_f[0].x;
    let norm = sqrt(norm_sq);
    var clip = 1.0;
    if (hp.clip_mode == CLIP_GLOBAL && hp.max_norm > 0.0) { clip = clip_coef(norm); }
    if (per_tensor) { clip = red_c[0]; }
    stats[0] = norm;
    stats[1] = clip;
    stats[2] = norm_sq;
    stats[3] = red_f[0].y;
  }
}

@compute @workgroup_size(WG_R)
fn scale_tensor_grads(@builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  if (w >= cu.nseg) { return; }
  let seg = segs[cu.pbase + w];
  let scale = stats[6u + 4u * seg.z];
  if (scale == 1.0) { return; }
  let first4 = seg.x / 4u;
  let end4 = (seg.y + 3u) / 4u;
  let win4 = cu.base / 4u;
  for (var k = 0u; k < VPT; k++) {
    let i4 = first4 + k * WG_R + lid;
    if (i4 < end4) {
      let g = g4[i4 - win4];
      g4[i4 - win4] = select(g, g * scale, lanes_in(i4, seg.x, seg.y));
    }
  }
}

// ---------------------------------------------------------------- fp32 AdamW (+ f16 mirror)

// This step's bias-corrected (neg_step, bc2_sqrt, q32_step, q32_eps): the host's, or with loss
// scaling the GPU's, which counts applied steps only (bias_correct).
fn adam_step() -> vec4<f32> {
  if (SKIP_NONFINITE) {
    let tail = arrayLength(&stats) - 8u;
    return vec4<f32>(stats[tail + 2u], stats[tail + 3u], stats[tail + 4u], stats[tail + 5u]);
  }
  return vec4<f32>(hp.neg_step, hp.bc2_sqrt, hp.q32_step, hp.q32_eps);
}

// One vec4 of the chunk: returns the new weights (written already).
fn adam4(i: u32) -> vec4<f32> {
  if (SKIP_NONFINITE && stats[3] > 0.0) { return w4[i]; }   // zero_skipped_grads zeroes g
  let g = clean4(g4[i]) * grad_scale();
  var w = w4[i];
  // decay_end is a multiple of 64: a vec4 never straddles the boundary.
  if (cu.base + 4u * i < hp.decay_end) { w = w * hp.decay; }
  let m_old = m4[i];
  let m = fma(vec4<f32>(hp.omb1), g - m_old, m_old);        // torch lerp_ (weight < 0.5)
  let v = v4[i] * hp.beta2 + (hp.omb2 * g) * g;             // torch mul_ + addcmul_
  let step = adam_step();
  let denom = sqrt(v) / step.y + hp.eps;
  w = w + (step.x * m) / denom;                             // torch addcdiv_
  w4[i] = w;
  m4[i] = m;
  v4[i] = v;
  g4[i] = vec4<f32>(0.0);
  return w;
}

@compute @workgroup_size(WG)
fn adamw_update(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= cu.n4) { return; }
  _ = adam4(i);
}

@compute @workgroup_size(WG)
fn adamw_update_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= cu.n4) { return; }
  mirror[i] = pack_mirror(adam4(i));
}

// ---------------------------------------------------------------- the update probe

// weight_delta (update_probe.js: an inspected step's update, tensor by tensor)
//   @binding(1) cu : Chunk uniform   @binding(4) w4 : the weights after the step   (read)
//   @binding(5) g4 : a copy of the weights before it -> w_after - w_before
//   Dispatch: as unscale_grads. reduce_norm_sq then sums its squares per tensor.
@compute @workgroup_size(WG)
fn weight_delta(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= cu.n4) { return; }
  g4[i] = w4[i] - g4[i];
}

// ---------------------------------------------------------------- 8-bit AdamW

//#include "lib/adamw_8bit.wgsl"

// ---------------------------------------------------------------- dynamic loss scaling

@compute @workgroup_size(WG)
fn unscale_grads(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= cu.n4) { return; }
  g4[i] = g4[i] * (1.0 / scaler[0]);
}

@compute @workgroup_size(WG)
fn zero_skipped_grads(@builtin(global_invocation_id) gid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= cu.n4 || stats[3] == 0.0) { return; }
  g4[i] = vec4<f32>(0.0);
}

@compute @workgroup_size(1)
fn bias_correct() {
  let tail = arrayLength(&stats) - 8u;
  let t = scaler[2] + 1.0;          // this step's, if it is applied
  let bc1 = 1.0 - pow(hp.beta1, t);
  let bc2_sqrt = sqrt(1.0 - pow(hp.beta2, t));
  stats[tail + 2u] = -(hp.lr / bc1);
  stats[tail + 3u] = bc2_sqrt;
  stats[tail + 4u] = -hp.lr * bc2_sqrt / bc1;
  stats[tail + 5u] = hp.eps * bc2_sqrt;
}

@compute @workgroup_size(1)
fn update_loss_scale() {
  let tail = arrayLength(&stats) - 8u;
  let scale = scaler[0];
  let skipped = stats[3] > 0.0;
  stats[tail] = scale;
  stats[tail + 1u] = select(0.0, 1.0, skipped);
  if (!skipped) { scaler[2] = scaler[2] + 1.0; }
  if (skipped) {
    scaler[0] = scale * 0.5;
    scaler[1] = 0.0;
  } else if (scaler[1] + 1.0 >= f32(GROWTH)) {
    scaler[0] = scale * 2.0;
    scaler[1] = 0.0;
  } else {
    scaler[1] = scaler[1] + 1.0;
  }
}
