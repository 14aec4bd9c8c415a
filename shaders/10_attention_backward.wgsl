// 10_attention_backward: gradients of causal attention, FlashAttention-2 style (tiling in
// lib/attention.wgsl), recomputing P from q, k and the saved logsumexp. With
// P_ts = exp(q_t.k_s * scale - lse_t) (s <= t), dO = dy, delta_t = dO_t . y_t:
//   dS_ts = P_ts * (dO_t . v_s - delta_t)
//   dq_t  = scale * sum_s dS_ts k_s    (attention_backward_dq: a workgroup per 64 queries walks
//                                       the key blocks 0 .. its own)
//   dk_s  = scale * sum_t dS_ts q_t    (attention_backward_dkdv: a workgroup per 64 keys walks
//   dv_s  = sum_t P_ts dO_t             the query blocks from its own to the last)
// Per block both kernels compute the 64 x 64 scores and dO.v products as register tiles, form P
// and dS in registers, stage them in workgroup memory and add their products with k (dq) or
// q and dO (dk, dv) to per-thread register tiles. No atomics: each output element is owned by
// one thread and every sum runs in a fixed order, so results are bit-identical run to run.
//
//   @binding(0) dims  : {B, T, H, D, C, scale}   uniform
//   @binding(1) qkv   : array<f32> [B, T, 3C]    read (forward's q, k after RoPE, v)
//   @binding(2) y     : array<f32> [B, T, C]     read (forward output; dq only, dkdv binds it unread)
//   @binding(3) dy    : array<f32> [B, T, C]     read
//   @binding(4) lse   : array<f32> [B, H, T]     read
//   @binding(5) delta : array<f32> [B, H, T]     dq pass: = dO.y ; dkdv pass: read
//   @binding(6) dqkv  : array<f32> [B, T, 3C]    dq pass: = dq third; dkdv pass: = dk, dv thirds
//   @binding(7) qkv4, @binding(8) dy4: array<vec4<f32>>, the qkv and dy buffers again (read when
//               D % 4 == 0; kernels.js binds qkv for both otherwise)
//   @binding(9) ds4   : array<vec4<f32>> [B, H, T, TP]  with DS: dS, TP = T rounded up to 4
//                       (dkdv: =, dq: read); without, 4 floats bound unused
// Dispatch (all): B * H * ceil(T / BLK) workgroups (2-D when over 65535).
// Without DS: dq (which also writes delta), then dkdv: both compute the scores.
// With DS (where the adapter binds the T x T buffer): attention_backward_delta, then dkdv, which
// also stores the dS it forms, then dq, which reads dS instead of recomputing the scores and dO.v
// (two of its three products). dS is the same value either way, bit for bit, and so is dq.

//#include "lib/attention.wgsl"

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<f32>;
@group(0) @binding(7) var<storage, read> qkv4: array<vec4<f32>>;   // qkv again, as vec4s
@group(0) @binding(8) var<storage, read> dy4: array<vec4<f32>>;    // dy again, as vec4s
@group(0) @binding(9) var<storage, read_write> ds4: array<vec4<f32>>;

override DS: bool = false;   // dS through ds4 (see above)

fn row_at(src: u32, i: u32) -> f32 {
  if (src == QKV) { return qkv[i]; }
  if (src == Y) { return y[i]; }
  return dy[i];
}

fn row_at4(src: u32, i: u32) -> vec4<f32> {
  if (src == QKV) { return qkv4[i]; }
  if (src == Y) { return vec4<f32>(y[4u * i], y[4u * i + 1u], y[4u * i + 2u], y[4u * i + 3u]); }
  return dy4[i];
}

fn sum4(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }

override KQ: u32 = 16u / NDV;   // dkdv: queries per chunk: P, dS [KQ][16] + dO, q rows [KQ][16 NDV]

// Output tiles (rows r0 + i, head dims 4 tx .. and 64 + 4 tx ..) times `scale` to dqkv elements
// base + row * 3C ..; rows past T and dims past HD are not written.
fn store_tiles(a: Out, base: u32, r0: u32, tx: u32, scale: f32) {
  for (var i = 0u; i < 4u; i = i + 1u) {
    if (r0 + i >= dims.T) { continue; }
    let o = base + (r0 + i) * 3u * dims.C;
    if (tx < HV) { store_row(o, tx, quad_row(a.lo, i) * scale); }
    if (16u + tx < HV) { store_row(o, 16u + tx, quad_row(a.hi, i) * scale); }
  }
}

fn store_row(o: u32, d4: u32, v: vec4<f32>) {
  for (var e = 0u; e < 4u; e = e + 1u) {
    if (4u * d4 + e < HD) { dqkv[o + 4u * d4 + e] = v[e]; }
  }
}

// Floats per dS row: T rounded up to 4, so every row starts on a vec4.
fn ds_row() -> u32 { return (dims.T + 3u) / 4u * 4u; }

// Vec4 index in ds4 of dS[b, h, t, s .. s + 3] of `head` (s a multiple of 4).
fn ds_at(head: Head, t: u32, s: u32) -> u32 {
  return ((head.hrow + t) * ds_row() + s) / 4u;
}

// The block's score and dO.v tiles (dq: rows queries, columns keys; dkdv: the transpose), their
// operands staged 16 head dims at a time by 64 threads each: rows of src from sbase (and dO or
// v) starting at r0, columns from c0 (see the callers' part, src, sbase, sstride).
struct Scores { s: Quad, dp: Quad }

fn score_tiles(src: u32, sbase: u32, sstride: u32, r0: u32, c0: u32, lid: u32) -> Scores {
  let part = lid / 64u;
  let tx = lid % 16u;
  let ty = lid / 16u;
  var s = quad0();
  var dp = quad0();
  for (var c = 0u; c < NSC; c = c + 1u) {     // 16 head dims per stage
    workgroupBarrier();
    stage_t(256u * part, src, sbase, sstride, select(r0, c0, part >= 2u), c, lid % 64u);
    workgroupBarrier();
    for (var d = 0u; d < 16u; d = d + 1u) {
      s = outer_fma(s, sm[16u * d + ty], sm[512u + 16u * d + tx]);
      dp = outer_fma(dp, sm[256u + 16u * d + ty], sm[768u + 16u * d + tx]);
    }
  }
  return Scores(s, dp);
}

// delta = dO . y of the 64 rows from q0 of (b, h): four threads per row, partials added in a fixed
// order. Returns this thread's (ty) four rows' delta; thread tx == 0 writes them.
fn block_delta(head: Head, q0: u32, lid: u32) -> vec4<f32> {
  let t = q0 + lid / 4u;
  var part = vec4<f32>(0.0);
  if (t < dims.T) {
    let o = head.obase + t * dims.C;
    for (var d4 = lid % 4u; d4 < HV; d4 = d4 + 4u) {
      part = fma(pad4(o, d4, DY), pad4(o, d4, Y), part);
    }
  }
  sm[lid] = part;
  workgroupBarrier();
  let ty = lid / 16u;
  var dl = vec4<f32>(0.0);
  for (var i = 0u; i < 4u; i = i + 1u) {
    let r = 4u * (4u * ty + i);
    dl[i] = sum4((sm[r] + sm[r + 1u]) + (sm[r + 2u] + sm[r + 3u]));
    let row = q0 + 4u * ty + i;
    if (lid % 16u == 0u && row < dims.T) { delta[head.hrow + row] = dl[i]; }
  }
  return dl;
}

@compute @workgroup_size(WG)
fn attention_backward_delta(@builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg, true);
  if (blk.w == 0u) { return; }
  _ = block_delta(head_of(blk.x, blk.y), blk.z * BLK, lid);
}

@compute @workgroup_size(WG)
fn attention_backward_dq(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg, true);
  if (blk.w == 0u) { return; }          // whole workgroups only: barriers stay uniform
  let head = head_of(blk.x, blk.y);
  let qb = blk.z;
  let tx = lid % 16u;
  let ty = lid / 16u;
  let q0 = qb * BLK;
  let rows = vec4<u32>(q0 + 4u * ty) + vec4<u32>(0u, 1u, 2u, 3u);   // this thread's queries

  // delta = dO . y of the block's rows (with DS, attention_backward_delta wrote it already)
  var dl = vec4<f32>(0.0);
  if (!DS) { dl = block_delta(head, q0, lid); }
  var lr = vec4<f32>(0.0);
  for (var i = 0u; i < 4u; i = i + 1u) { lr[i] = lse[head.hrow + min(rows[i], dims.T - 1u)]; }

  // Score-phase staging, 64 threads per operand: q, dO (the rows), k, v (the columns).
  let part = lid / 64u;
  let src = select(QKV, DY, part == 1u);
  let sbase = select(select(head.qbase, head.obase, part == 1u),
                     select(head.kbase, head.vbase, part == 3u), part >= 2u);
  let sstride = select(3u * dims.C, dims.C, part == 1u);
  var acc = out0();               // dq tiles: rows x .. w by head dims
  for (var kb = 0u; kb <= qb; kb = kb + 1u) {   // key blocks up to the diagonal
    let k0 = kb * BLK;
    var s = quad0();              // columns j: keys k0 + 4 tx + j; components: the rows
    let kt = k0 + 4u * tx;
    if (DS) {
      // dS as dkdv stored it: per query row 4 keys, transposed into the register tile (rows
      // past T and keys past the padded row read clamped and are masked below)
      let kc = min(kt, ds_row() - 4u);
      let r0 = ds4[ds_at(head, min(rows.x, dims.T - 1u), kc)];
      let r1 = ds4[ds_at(head, min(rows.y, dims.T - 1u), kc)];
      let r2 = ds4[ds_at(head, min(rows.z, dims.T - 1u), kc)];
      let r3 = ds4[ds_at(head, min(rows.w, dims.T - 1u), kc)];
      s = Quad(vec4<f32>(r0.x, r1.x, r2.x, r3.x), vec4<f32>(r0.y, r1.y, r2.y, r3.y),
               vec4<f32>(r0.z, r1.z, r2.z, r3.z), vec4<f32>(r0.w, r1.w, r2.w, r3.w));
    } else {
      // dS = P (dP - delta)
      let sc = score_tiles(src, sbase, sstride, q0, k0, lid);
      s = Quad(exp(sc.s.x * dims.scale - lr) * (sc.dp.x - dl),
               exp(sc.s.y * dims.scale - lr) * (sc.dp.y - dl),
               exp(sc.s.z * dims.scale - lr) * (sc.dp.z - dl),
               exp(sc.s.w * dims.scale - lr) * (sc.dp.w - dl));
    }
    s = mask_keys(s, kt, rows, 0.0);              // 0 where masked (causal, or keys past T)
    acc = tile_rows(acc, s, head.kbase, k0, lid);   // acc += dS k
  }
  store_tiles(acc, head.qbase, q0 + 4u * ty, tx, dims.scale);
}

@compute @workgroup_size(WG)
fn attention_backward_dkdv(@builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg, false);  // key block 0 (the most query blocks) first
  if (blk.w == 0u) { return; }
  let head = head_of(blk.x, blk.y);
  let kb = blk.z;
  let tx = lid % 16u;
  let ty = lid / 16u;
  let k0 = kb * BLK;
  let nb = (dims.T + BLK - 1u) / BLK;
  let C3 = 3u * dims.C;
  let hrow = head.hrow;
  let keys = vec4<u32>(k0 + 4u * ty) + vec4<u32>(0u, 1u, 2u, 3u);   // this thread's keys
  // Score-phase staging, 64 threads per operand: k, v (the rows), q, dO (the columns).
  let part = lid / 64u;
  let src = select(QKV, DY, part == 3u);
  let sbase = select(select(head.kbase, head.vbase, part == 1u),
                     select(head.qbase, head.obase, part == 3u), part >= 2u);
  let sstride = select(C3, dims.C, part == 3u);
  var dk = out0();                // keys x .. w by head dims
  var dv = out0();
  for (var qb = kb; qb < nb; qb = qb + 1u) {   // query blocks from the diagonal on
    let q0 = qb * BLK;
    // columns j: queries q0 + 4 tx + j; components: the keys (dp: v . dO, same layout)
    let sc = score_tiles(src, sbase, sstride, k0, q0, lid);
    var s = sc.s;
    var dp = sc.dp;
    // s becomes P, dp becomes dS; 0 where masked (causal, or queries past T).
    let t = q0 + 4u * tx;
    let lq = vec4<f32>(lse[hrow + min(t, dims.T - 1u)], lse[hrow + min(t + 1u, dims.T - 1u)],
                       lse[hrow + min(t + 2u, dims.T - 1u)], lse[hrow + min(t + 3u, dims.T - 1u)]);
    let dq = vec4<f32>(delta[hrow + min(t, dims.T - 1u)], delta[hrow + min(t + 1u, dims.T - 1u)],
                       delta[hrow + min(t + 2u, dims.T - 1u)], delta[hrow + min(t + 3u, dims.T - 1u)]);
    let z = vec4<f32>(0.0);
    s = Quad(select(exp(s.x * dims.scale - lq.x), z, (keys > vec4<u32>(t)) | vec4<bool>(t >= dims.T)),
             select(exp(s.y * dims.scale - lq.y), z, (keys > vec4<u32>(t + 1u)) | vec4<bool>(t + 1u >= dims.T)),
             select(exp(s.z * dims.scale - lq.z), z, (keys > vec4<u32>(t + 2u)) | vec4<bool>(t + 2u >= dims.T)),
             select(exp(s.w * dims.scale - lq.w), z, (keys > vec4<u32>(t + 3u)) | vec4<bool>(t + 3u >= dims.T)));
    dp = Quad(s.x * (dp.x - dq.x), s.y * (dp.y - dq.y), s.z * (dp.z - dq.z), s.w * (dp.w - dq.w));
    if (DS && k0 + 4u * ty < ds_row()) {   // dS rows (queries t + j) for dq
      if (t < dims.T) { ds4[ds_at(head, t, k0 + 4u * ty)] = dp.x; }
      if (t + 1u < dims.T) { ds4[ds_at(head, t + 1u, k0 + 4u * ty)] = dp.y; }
      if (t + 2u < dims.T) { ds4[ds_at(head, t + 2u, k0 + 4u * ty)] = dp.z; }
      if (t + 3u < dims.T) { ds4[ds_at(head, t + 3u, k0 + 4u * ty)] = dp.w; }
    }
    for (var c = 0u; c < BLK; c = c + KQ) {    // dv += P^T dO, dk += dS^T q, KQ queries at a time
      workgroupBarrier();
      if (4u * tx >= c && 4u * tx < c + KQ) {
        stage_tile(16u * (4u * tx - c) + ty, s);
        stage_tile(16u * KQ + 16u * (4u * tx - c) + ty, dp);
      }
      stage_n(32u * KQ, DY, head.obase, dims.C, q0 + c, KQ, lid);
      stage_n(32u * KQ + 16u * NDV * KQ, QKV, head.qbase, C3, q0 + c, KQ, lid);
      workgroupBarrier();
      for (var kk = 0u; kk < KQ; kk = kk + 1u) {
        let p = sm[16u * kk + ty];
        let ds = sm[16u * KQ + 16u * kk + ty];
        let go = 32u * KQ + 16u * NDV * kk + tx;
        let qo = go + 16u * NDV * KQ;
        dv.lo = outer_fma(dv.lo, sm[go], p);
        dk.lo = outer_fma(dk.lo, sm[qo], ds);
        if (NDV > 1u) {
          dv.hi = outer_fma(dv.hi, sm[go + 16u], p);
          dk.hi = outer_fma(dk.hi, sm[qo + 16u], ds);
        }
      }
    }
  }
  store_tiles(dk, head.kbase, k0 + 4u * ty, tx, dims.scale);   // the scores carry the scale
  store_tiles(dv, head.vbase, k0 + 4u * ty, tx, 1.0);
}
