// What 05_attention_rows and 10_attention_backward_rows share (one thread per row): the dims uniform (kernels.js
// attentionDims writes it), the pipeline constants, and the query-block decomposition.

override WG: u32;                // rows (queries or keys) per workgroup, one per thread (kernels.js)
// Head dim as a pipeline constant: the d-loops get constant trip counts, so the compiler can
// unroll them and keep the per-thread rows in registers instead of local memory.
override HD: u32 = 64u;
override KT: u32 = 16u;          // rows per tile staged in workgroup memory
override HV: u32 = (HD + 3u) / 4u;   // vec4s per head row (zero-padded past HD)
const MAX_D: u32 = 128u;
const MAX_V: u32 = MAX_D / 4u;
// Rows are held and staged as vec4s: a dot product or an update reads one vec4 of workgroup
// memory per 4 FMAs instead of one float per FMA.

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }

// (batch, head, first row, 1 if the workgroup has rows) of this workgroup: the grid covers
// [B, H, ceil(T / WG)] blocks of WG consecutive rows.
fn block_of(wid: vec3<u32>, nwg: vec3<u32>) -> vec4<u32> {
  let nb = (dims.T + WG - 1u) / WG;
  let w = wid.x + wid.y * nwg.x;
  return vec4<u32>(w / (nb * dims.H), (w / nb) % dims.H, (w % nb) * WG,
                   select(0u, 1u, w < dims.B * dims.H * nb));
}

// Row sources for pad4: the including file's row_at(src, i) returns element i of qkv, the forward
// output y or its gradient dO (WGSL cannot pass a storage array to a function).
const QKV: u32 = 0u;
const Y: u32 = 1u;
const DY: u32 = 2u;

// Elements 4*d4 .. 4*d4 + 3 of the head row that starts at element o of `src`, zeros past HD.
fn pad4(o: u32, d4: u32, src: u32) -> vec4<f32> {
  if (HD % 4u == 0u) {
    let i = o + 4u * d4;
    return vec4<f32>(row_at(src, i), row_at(src, i + 1u), row_at(src, i + 2u), row_at(src, i + 3u));
  }
  var r = vec4<f32>(0.0);
  for (var c = 0u; c < 4u; c = c + 1u) {
    if (4u * d4 + c < HD) { r[c] = row_at(src, o + 4u * d4 + c); }
  }
  return r;
}
