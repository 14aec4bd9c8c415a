// 05_attention: causal softmax attention, scale 1/sqrt(D), FlashAttention-2 style (tiling in
// lib/attention.wgsl). A workgroup takes 64 queries of one (batch, head) and walks the key
// blocks 0 .. its own in order; per block: scores S = q k^T * scale (register-tiled), causal
// mask on the diagonal block, the block's row max (through workgroup memory), then the online
// softmax update m, l, acc *= exp(m_old - m_new) and acc += exp(S - m) v. Each thread keeps the
// partial row sums l of its own key columns; they are added in a fixed order at the end.
//
//   @binding(0) dims : {B, T, H, D, C, scale}          uniform
//   @binding(1) qkv  : array<f32> [B, T, 3C]           read (q, k after RoPE; v)
//   @binding(2) y    : array<f32> [B, T, C]            = softmax(q k^T * scale + mask) v
//   @binding(3) lse  : array<f32> [B, H, T]            = logsumexp of the scaled scores (backward)
//   @binding(4) qkv4 : array<vec4<f32>>                qkv's buffer again (read when D % 4 == 0)
// Dispatch: B * H * ceil(T / BLK) workgroups (2-D when over 65535). D <= MAX_D.

//#include "lib/attention.wgsl"

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read> qkv4: array<vec4<f32>>;   // qkv again, as vec4s

fn row_at(src: u32, i: u32) -> f32 { return qkv[i]; }   // the forward reads qkv only
fn row_at4(src: u32, i: u32) -> vec4<f32> { return qkv4[i]; }

// Row t of the output: a / l to y (head dims 4 d4 .. past HD dropped).
fn store_y(o: u32, d4: u32, a: vec4<f32>) {
  for (var e = 0u; e < 4u; e = e + 1u) {
    if (4u * d4 + e < HD) { y[o + 4u * d4 + e] = a[e]; }
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let blk = block_of(wid, nwg, true);
  if (blk.w == 0u) { return; }          // whole workgroups only: barriers stay uniform
  let head = head_of(blk.x, blk.y);
  let qb = blk.z;
  let tx = lid % 16u;
  let ty = lid / 16u;
  let q0 = qb * BLK;
  let rows = vec4<u32>(q0 + 4u * ty) + vec4<u32>(0u, 1u, 2u, 3u);   // this thread's queries
  var acc = out0();               // output tiles: rows x .. w by head dims
  var m = vec4<f32>(-3.0e38);     // running max of rows
  var l = vec4<f32>(0.0);         // running sum over this thread's key columns
  // Score-phase staging: 64 threads per operand chunk (q: d 0..15, q: d 16..31, k: the same).
  // (The backward's score_tiles stages q, dO, k and v 16 d at a time for S and dP together; the
  // forward needs S only and stages twice the head dims per barrier pair.)
  let part = lid / 64u;
  let sbase = select(head.qbase, head.kbase, part >= 2u);
  for (var kb = 0u; kb <= qb; kb = kb + 1u) {   // key blocks up to the diagonal
    let k0 = kb * BLK;
    var s = quad0();              // columns j: keys k0 + 4 tx + j; components: the rows
    for (var c = 0u; c < NSC; c = c + 2u) {     // 32 head dims per stage
      workgroupBarrier();
      stage_t(256u * part, QKV, sbase, 3u * dims.C, select(q0, k0, part >= 2u), c + part % 2u,
              lid % 64u);
      workgroupBarrier();
      for (var d = 0u; d < 32u; d = d + 1u) {
        s = outer_fma(s, sm[16u * d + ty], sm[512u + 16u * d + tx]);
      }
    }
    let f = dims.scale;           // scaled, -3e38 where masked
    s = mask_keys(Quad(s.x * f, s.y * f, s.z * f, s.w * f), k0 + 4u * tx, rows, -3.0e38);
    workgroupBarrier();                 // the score phase's reads are done
    sm[16u * ty + tx] = max(max(s.x, s.y), max(s.z, s.w));
    workgroupBarrier();
    var m_new = m;
    for (var t = 0u; t < 16u; t = t + 1u) { m_new = max(m_new, sm[16u * ty + t]); }
    let corr = exp(m - m_new);
    m = m_new;
    s = Quad(exp(s.x - m), exp(s.y - m), exp(s.z - m), exp(s.w - m));
    l = fma(l, corr, (s.x + s.y) + (s.z + s.w));
    acc.lo = scale_rows(acc.lo, corr);
    if (NDV > 1u) { acc.hi = scale_rows(acc.hi, corr); }
    acc = tile_rows(acc, s, head.vbase, k0, lid);   // acc += P v
  }
  workgroupBarrier();
  sm[16u * ty + tx] = l;
  workgroupBarrier();
  var lt = vec4<f32>(0.0);
  for (var t = 0u; t < 16u; t = t + 1u) { lt = lt + sm[16u * ty + t]; }   // fixed order
  let inv = 1.0 / lt;
  let a0 = scale_rows(acc.lo, inv);
  let a1 = scale_rows(acc.hi, inv);
  for (var i = 0u; i < 4u; i = i + 1u) {
    let t = rows[i];
    if (t >= dims.T) { continue; }
    let o = head.obase + t * dims.C;
    if (tx < HV) { store_y(o, tx, quad_row(a0, i)); }
    if (16u + tx < HV) { store_y(o, 16u + tx, quad_row(a1, i)); }
    if (tx == 0u) { lse[head.hrow + t] = m[i] + log(lt[i]); }
  }
}
