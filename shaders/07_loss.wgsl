// 07_loss: mean token cross-entropy and its gradient, one pass over the vocabulary per row.
// The loss may run over the batch's rows a chunk at a time (model.js lossChunkRows: the logits of
// a big batch do not fit one buffer): a dispatch takes rows [row0, row0 + rows) of the N.
//
// cross_entropy (one workgroup per row of the chunk)
//   @binding(0) dims    : {N = B*T rows, V,     uniform; N sizes the losses layout and the mean's
//                          row0, rows}          1 / N, so a row's loss and dlogits are the same
//                                               bits whichever chunk computes them
//   @binding(1) logits  : array<f32> [rows, V]  the chunk's rows (row r is row row0 + r of the
//                                               batch); read, then = dlogits in place (when
//                                               WRITE_GRAD): (softmax - onehot(target)) / N
//   @binding(2) targets : array<u32> [N]        read at row0 + r
//   @binding(3) losses  : array<f32> [3N + 4]   [n] = lse - logit[target];  [N] = mean (loss_mean);
//                                               [N + 1] = max |logit|, [N + 2] = min softmax
//                                               denominator (loss_mean); [N + 4 + 2n] = row n's
//                                               max |logit|, [N + 5 + 2n] = its denominator
//                                               sum_v exp(logit_v - max_v), in [1, V]: 1 means one
//                                               token holds all of the row's probability
//                                               (n = row0 + r: the batch's row index)
//   Dispatch: rows workgroups (2-D when over 65535) of WG threads.
// cross_entropy_direct: the same at WG 8 with a row per thread, for a software adapter
//   (kernels.js): lane l of 8 does thread l's strided part, then reduce.wgsl's trees at WG 8
//   (tree8_max, tree8_sum); no workgroup memory or barriers, the same bits.
//   Dispatch: grid1d(ceil(rows / DWG)) workgroups of DWG threads.
//
// scale_dlogits (mixed precision's loss scaling; elementwise over the chunk's rows x V)
//   @binding(4) scaler  : array<f32> [4]        [0] = the loss scale (12_optimizer.wgsl keeps it)
//   dlogits *= scale, a power of two, so exactly; the backward's f16 operands then hold gradients
//   that would underflow unscaled. Dispatch: ceil(rows V / WG) workgroups (2-D when large).
//
// loss_mean (one workgroup, after every chunk's cross_entropy; fixed-order sum, so deterministic)
//   binds dims and losses only (row0, rows unused); losses[N] = sum(losses[0..N)) / N, and the
//   batch's max |logit| and min denominator from the rows'. Dispatch: 1 workgroup.

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it
override WRITE_GRAD: bool = true;

struct Dims { N: u32, V: u32, row0: u32, rows: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;
@group(0) @binding(4) var<storage, read> scaler: array<f32>;

//#include "lib/reduce.wgsl"
//#include "lib/common.wgsl"

@compute @workgroup_size(WG)
fn cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) t: u32) {
  let r = wid.x + wid.y * nwg.x;   // the chunk's row
  if (r >= dims.rows) { return; }
  let row = dims.row0 + r;         // the batch's
  let base = r * dims.V;
  var m = -3.0e38;
  var neg = -3.0e38;   // max of -logit: with m, the row's max |logit|
  for (var v = t; v < dims.V; v = v + WG) {
    let x = logits[base + v];
    m = max(m, x);
    neg = max(neg, -x);
  }
  m = reduce_max(t, m);
  neg = reduce_max(t, neg);
  var s = 0.0;
  for (var v = t; v < dims.V; v = v + WG) { s = s + exp(logits[base + v] - m); }
  s = reduce_sum(t, s);
  let tgt = targets[row];
  let lse = m + log(s);
  if (t == 0u) {
    losses[row] = lse - logits[base + tgt];
    losses[dims.N + 4u + 2u * row] = max(m, neg);
    losses[dims.N + 5u + 2u * row] = s;
  }
  workgroupBarrier();   // the loss read of logits[target] happens before the overwrite below
  if (WRITE_GRAD) {
    let inv_n = 1.0 / f32(dims.N);
    for (var v = t; v < dims.V; v = v + WG) {
      let p = exp(logits[base + v] - lse);
      logits[base + v] = (p - select(0.0, 1.0, v == tgt)) * inv_n;
    }
  }
}

fn logit4(i: u32) -> vec4<f32> {
  return vec4<f32>(logits[i], logits[i + 1u], logits[i + 2u], logits[i + 3u]);
}

@compute @workgroup_size(DWG)
fn cross_entropy_direct(@builtin(global_invocation_id) gid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>) {
  let r = flat_id(gid, nwg, DWG);   // the chunk's row
  if (r >= dims.rows) { return; }
  let row = dims.row0 + r;          // the batch's
  let base = r * dims.V;
  let full = dims.V & ~7u;   // whole rounds of the 8 threads; then lanes l < V - full
  var mlo = vec4<f32>(-3.0e38);
  var mhi = vec4<f32>(-3.0e38);
  var nlo = vec4<f32>(-3.0e38);
  var nhi = vec4<f32>(-3.0e38);
  for (var v = 0u; v < full; v = v + 8u) {
    let lo = logit4(base + v);
    let hi = logit4(base + v + 4u);
    mlo = max(mlo, lo); mhi = max(mhi, hi);
    nlo = max(nlo, -lo); nhi = max(nhi, -hi);
  }
  for (var l = 0u; l < dims.V - full; l = l + 1u) {
    let x = logits[base + full + l];
    if (l < 4u) { mlo[l] = max(mlo[l], x); nlo[l] = max(nlo[l], -x); }
    else { mhi[l - 4u] = max(mhi[l - 4u], x); nhi[l - 4u] = max(nhi[l - 4u], -x); }
  }
  let m = tree8_max(mlo, mhi);
  let neg = tree8_max(nlo, nhi);
  var slo = vec4<f32>(0.0);
  var shi = vec4<f32>(0.0);
  for (var v = 0u; v < full; v = v + 8u) {
    slo = slo + exp(logit4(base + v) - m);
    shi = shi + exp(logit4(base + v + 4u) - m);
  }
  for (var l = 0u; l < dims.V - full; l = l + 1u) {
    let e = exp(logits[base + full + l] - m);
    if (l < 4u) { slo[l] = slo[l] + e; } else { shi[l - 4u] = shi[l - 4u] + e; }
  }
  let s = tree8_sum(slo, shi);
  let tgt = targets[row];
  let lse = m + log(s);
  losses[row] = lse - logits[base + tgt];
  losses[dims.N + 4u + 2u * row] = max(m, neg);
  losses[dims.N + 5u + 2u * row] = s;
  if (WRITE_GRAD) {
    let inv_n = 1.0 / f32(dims.N);
    for (var v = 0u; v < dims.V; v = v + 1u) {
      let p = exp(logits[base + v] - lse);
      logits[base + v] = (p - select(0.0, 1.0, v == tgt)) * inv_n;
    }
  }
}

@compute @workgroup_size(WG)
fn loss_mean(@builtin(local_invocation_index) t: u32) {
  // Each thread sums a contiguous chunk, then a fixed tree: same order every run.
  let chunk = (dims.N + WG - 1u) / WG;
  var s = 0.0;
  for (var n = t * chunk; n < min(dims.N, (t + 1u) * chunk); n = n + 1u) { s = s + losses[n]; }
  s = reduce_sum(t, s);
  var big = 0.0;
  var low = 3.0e38;
  for (var n = t * chunk; n < min(dims.N, (t + 1u) * chunk); n = n + 1u) {
    big = max(big, losses[dims.N + 4u + 2u * n]);
    low = min(low, losses[dims.N + 5u + 2u * n]);
  }
  big = reduce_max(t, big);
  low = -reduce_max(t, -low);
  if (t == 0u) {
    losses[dims.N] = s / f32(dims.N);
    losses[dims.N + 1u] = big;
    losses[dims.N + 2u] = low;
  }
}

@compute @workgroup_size(WG)
fn scale_dlogits(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= dims.rows * dims.V) { return; }
  logits[i] = logits[i] * scaler[0];
}
