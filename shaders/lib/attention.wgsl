// What 05_attention and 10_attention_backward share: the dims uniform (kernels.js
// attentionDims writes it), the pipeline constants, the block decomposition, the staging of
// row blocks in workgroup memory, the causal mask and the output phase (tile times rows).
//
// Tiling (FlashAttention-2 style): the T x T score matrix of one (batch, head) is cut into
// BLK x BLK blocks. A workgroup of 16 x 16 threads owns one row block (the forward and dq: 64
// queries; dk/dv: 64 keys) and walks the blocks of the other side in a fixed order, skipping
// those entirely above the diagonal. Thread (ty, tx) holds a 4 x 4 register tile of the block's
// scores: rows 4 ty .. 4 ty + 3 (a vec4's components) by columns 4 tx .. 4 tx + 3 (vec4 j), so
// both products of a block are register-tiled matmuls out of workgroup memory:
//   scores   S[r, c]  = sum_d A[r, d] B[c, d]   A, B staged transposed, 16 or 32 d at a time:
//                      per d one vec4 of A (4 rows) and one of B (4 columns) feed 16 FMAs
//   outputs  O[r, d] += sum_c P[r, c] X[c, d]   P staged [c][r], X staged as rows: per c one vec4
//                      of P and one of X (4 head dims, 16 tx + d4 per column group) feed 16 FMAs
// Every sum runs in a fixed order and each output element is owned by one thread: no atomics,
// results are bit-identical run to run.

// Head dim as a pipeline constant: loops get constant trip counts, so the compiler can unroll
// them and keep the register tiles in registers.
override HD: u32 = 64u;
override HV: u32 = (HD + 3u) / 4u;        // vec4s per head row (zero-padded past HD)
override NSC: u32 = (HV + 3u) / 4u;       // 16-wide head-dim chunks of a score product
override NDV: u32 = (HV + 15u) / 16u;     // vec4 head-dim columns per thread in outputs (1, 2)
const MAX_D: u32 = 128u;                  // NDV <= 2
// Rows per block: kernels.js ATTENTION_BLOCK, from which it also sizes the grid. The workgroup
// follows from it, one 4 x 4 register tile of the block per thread; the thread layout below is
// written for 64 (16 x 16 threads, whose score phase stages four operand chunks of 64 threads).
override BLK: u32;
override WG: u32 = (BLK / 4u) * (BLK / 4u);
override KC: u32 = 32u / NDV;   // output phase (tile_rows): columns per chunk, [KC][16] + [KC][16 NDV]
// Workgroup memory, reused phase by phase (barriers between): 16 KiB, WebGPU's default limit.
//   score phase: four transposed operand chunks of 16 d x 64 rows (256 vec4s each)
//   output phase: P (or dS) chunks [c][row vec4] and staged rows [c][16 NDV vec4]
var<workgroup> sm: array<vec4<f32>, 1024>;

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }

// (batch, head, row block, 1 if the workgroup has one). Workgroup w takes block w / (B * H):
// with `reverse`, the last (largest) blocks first, so the causal triangle's long rows start early.
fn block_of(wid: vec3<u32>, nwg: vec3<u32>, reverse: bool) -> vec4<u32> {
  let nb = (dims.T + BLK - 1u) / BLK;
  let bh = dims.B * dims.H;
  let w = wid.x + wid.y * nwg.x;
  let j = w / bh;
  return vec4<u32>((w % bh) / dims.H, w % dims.H, select(j, nb - 1u - j, reverse),
                   select(0u, 1u, w < bh * nb));
}

// Where a (batch, head)'s rows start: its q, k, v in qkv (rows of 3C), its y and dO (rows of C),
// its lse and delta ([B, H, T]).
struct Head { qbase: u32, kbase: u32, vbase: u32, obase: u32, hrow: u32 }

fn head_of(b: u32, h: u32) -> Head {
  let qbase = b * dims.T * 3u * dims.C + h * dims.D;
  return Head(qbase, qbase + dims.C, qbase + 2u * dims.C, b * dims.T * dims.C + h * dims.D,
              (b * dims.H + h) * dims.T);
}

// Row sources for pad4: the including file's row_at(src, i) returns element i of qkv, the forward
// output y or its gradient dO, and row_at4(src, i) vec4 i of the same (WGSL cannot pass a storage
// array to a function).
const QKV: u32 = 0u;
const Y: u32 = 1u;
const DY: u32 = 2u;

// Elements 4*d4 .. 4*d4 + 3 of the head row that starts at element o of `src`, zeros past HD.
// With HD % 4 == 0 every head row starts on a vec4 (C and 3C are multiples of 4 as well), and the
// row is read through the vec4 view of its buffer: one 16-byte load per lane, so a warp's loads
// of neighbouring vec4s are fully coalesced (four scalar loads would each touch 4x the sectors).
fn pad4(o: u32, d4: u32, src: u32) -> vec4<f32> {
  if (HD % 4u == 0u) { return row_at4(src, o / 4u + d4); }
  var r = vec4<f32>(0.0);
  for (var c = 0u; c < 4u; c = c + 1u) {
    if (4u * d4 + c < HD) { r[c] = row_at(src, o + 4u * d4 + c); }
  }
  return r;
}

// A 4 x 4 register tile as four vec4s: the score tiles (x .. w: columns j, components: rows) and
// the output tiles (x .. w: rows i, components: 4 head dims). Named vec4s, not an indexed array,
// so no compiler needs to unroll loops to keep them in registers.
struct Quad { x: vec4<f32>, y: vec4<f32>, z: vec4<f32>, w: vec4<f32> }

fn quad0() -> Quad { return Quad(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0)); }

// t.j += a * b[j]: one step of a register-tiled product (16 FMAs).
fn outer_fma(t: Quad, a: vec4<f32>, b: vec4<f32>) -> Quad {
  return Quad(fma(a, vec4<f32>(b.x), t.x), fma(a, vec4<f32>(b.y), t.y),
              fma(a, vec4<f32>(b.z), t.z), fma(a, vec4<f32>(b.w), t.w));
}

// Row i of t times f[i].
fn scale_rows(t: Quad, f: vec4<f32>) -> Quad {
  return Quad(t.x * f.x, t.y * f.y, t.z * f.z, t.w * f.w);
}

// Member i of t.
fn quad_row(t: Quad, i: u32) -> vec4<f32> {
  return select(select(t.x, t.y, i == 1u), select(t.z, t.w, i == 3u), i >= 2u);
}

// A score tile (columns j: keys k0 + j; components: the queries `rows`) with `fill` where the key
// is past the query (causal) or past T.
fn mask_keys(s: Quad, k0: u32, rows: vec4<u32>, fill: f32) -> Quad {
  let n = vec4<f32>(fill);
  return Quad(select(s.x, n, (vec4<u32>(k0) > rows) | vec4<bool>(k0 >= dims.T)),
              select(s.y, n, (vec4<u32>(k0 + 1u) > rows) | vec4<bool>(k0 + 1u >= dims.T)),
              select(s.z, n, (vec4<u32>(k0 + 2u) > rows) | vec4<bool>(k0 + 2u >= dims.T)),
              select(s.w, n, (vec4<u32>(k0 + 3u) > rows) | vec4<bool>(k0 + 3u >= dims.T)));
}

// An output tile pair: rows 4 ty .. 4 ty + 3 (members x .. w) by head dims 4 tx .. (lo) and
// 64 + 4 tx .. (hi, used when NDV = 2).
struct Out { lo: Quad, hi: Quad }

fn out0() -> Out { return Out(quad0(), quad0()); }

// acc += S X over one block: S this thread's 4 x 4 tile of P or dS (rows 4 ty .., columns 4 tx ..),
// X the BLK rows of qkv from row r0 of `base` (v for the forward's P, k for dq's dS). KC columns
// at a time: S staged [column][row vec4] (stage_tile), X's rows as they are (stage_n); per column
// one vec4 of S and one of X feed 16 FMAs, columns in order.
fn tile_rows(acc: Out, s: Quad, base: u32, r0: u32, lid: u32) -> Out {
  let tx = lid % 16u;
  let ty = lid / 16u;
  var a = acc;
  for (var c = 0u; c < BLK; c = c + KC) {
    workgroupBarrier();
    if (4u * tx >= c && 4u * tx < c + KC) { stage_tile(16u * (4u * tx - c) + ty, s); }
    stage_n(16u * KC, QKV, base, 3u * dims.C, r0 + c, KC, lid);
    workgroupBarrier();
    for (var kk = 0u; kk < KC; kk = kk + 1u) {
      let p = sm[16u * kk + ty];
      let o = 16u * KC + 16u * NDV * kk + tx;
      a.lo = outer_fma(a.lo, sm[o], p);
      if (NDV > 1u) { a.hi = outer_fma(a.hi, sm[o + 16u], p); }
    }
  }
  return a;
}

// P or dS tile columns x .. w to sm[o], sm[o + 16], .. (staged [column][row vec4]).
fn stage_tile(o: u32, t: Quad) {
  sm[o] = t.x;
  sm[o + 16u] = t.y;
  sm[o + 32u] = t.z;
  sm[o + 48u] = t.w;
}

// Head dims 16 c .. 16 c + 15 of rows r0 .. r0 + 63 (row t at element base + t * stride of src;
// zeros past T or HD), transposed: sm[dst + 16 d + r / 4] holds element d of rows r .. r + 3.
// One call per 64 threads (lid: 0 .. 63 among them): each reads a 4 x 4 block (4 rows, one vec4
// of head dims) and writes it back transposed as 4 vec4s (neighbouring threads: neighbouring
// rows, so the stores hit distinct banks).
fn stage_t(dst: u32, src: u32, base: u32, stride: u32, r0: u32, c: u32, lid: u32) {
  let t = r0 + 4u * (lid % 16u);
  let d4 = 4u * c + lid / 16u;
  let v0 = row4(src, base, stride, t, d4);
  let v1 = row4(src, base, stride, t + 1u, d4);
  let v2 = row4(src, base, stride, t + 2u, d4);
  let v3 = row4(src, base, stride, t + 3u, d4);
  let o = dst + 64u * (lid / 16u) + lid % 16u;
  sm[o] = vec4<f32>(v0.x, v1.x, v2.x, v3.x);
  sm[o + 16u] = vec4<f32>(v0.y, v1.y, v2.y, v3.y);
  sm[o + 32u] = vec4<f32>(v0.z, v1.z, v2.z, v3.z);
  sm[o + 48u] = vec4<f32>(v0.w, v1.w, v2.w, v3.w);
}

// vec4 d4 of row t (zeros past T or HD).
fn row4(src: u32, base: u32, stride: u32, t: u32, d4: u32) -> vec4<f32> {
  if (t < dims.T && d4 < HV) { return pad4(base + t * stride, d4, src); }
  return vec4<f32>(0.0);
}

// Rows r0 .. r0 + n - 1 as they are: sm[dst + 16 NDV j + d4] = vec4 d4 of row r0 + j (zeros
// past T or HD).
fn stage_n(dst: u32, src: u32, base: u32, stride: u32, r0: u32, n: u32, lid: u32) {
  let w = 16u * NDV;
  for (var i = lid; i < n * w; i = i + WG) {
    let j = i / w;
    let d4 = i % w;
    sm[dst + i] = row4(src, base, stride, r0 + j, d4);
  }
}
