// What 06_swiglu and 09_ffn_backward share: the dims uniform and where element e of h [N, F]
// finds its gate and up in the fused gate|up projection output gu [N, 2F] (row n: gate at
// [0, F), up at [F, 2F)).
struct Dims { N: u32, F: u32, pad0: u32, pad1: u32 }

// The index in gu of element e's gate; its up is dims.F further on.
fn gate_at(e: u32) -> u32 {
  let n = e / dims.F;
  let i = e % dims.F;
  return n * 2u * dims.F + i;
}
