// What 05_attention and 10_attention_backward share: the dims uniform (kernels.js
// attentionDims writes it), the pipeline constants, and the query-block decomposition.

override WG: u32 = 64u;          // rows (queries or keys) per workgroup, one per thread
// Head dim as a pipeline constant: the d-loops get constant trip counts, so the compiler can
// unroll them and keep the per-thread rows in registers instead of local memory.
override HD: u32 = 64u;
override KT: u32 = 16u;          // rows per tile staged in workgroup memory
const MAX_D: u32 = 128u;

struct Dims { B: u32, T: u32, H: u32, D: u32, C: u32, scale: f32, pad0: u32, pad1: u32 }

// (batch, head, first row, 1 if the workgroup has rows) of this workgroup: the grid covers
// [B, H, ceil(T / WG)] blocks of WG consecutive rows.
fn block_of(wid: vec3<u32>, nwg: vec3<u32>) -> vec4<u32> {
  let nb = (dims.T + WG - 1u) / WG;
  let w = wid.x + wid.y * nwg.x;
  return vec4<u32>(w / (nb * dims.H), (w / nb) % dims.H, (w % nb) * WG,
                   select(0u, 1u, w < dims.B * dims.H * nb));
}
