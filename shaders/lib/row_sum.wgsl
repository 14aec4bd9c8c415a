// What 02_norm and 08_norm_backward share: one workgroup of WG threads per row of x [N, C] (the
// includer's `dims` has N and C), and the row's sum of row_term(base, c) over its C columns,
// which the including file defines (base: the row's first element): strided over the threads,
// then tree-reduced (lib/reduce.wgsl), in the same order every run. Every thread must call.

//#include "lib/reduce.wgsl"

fn row_sum(t: u32, base: u32) -> f32 {
  var s = 0.0;
  for (var c = t; c < dims.C; c = c + WG) { s = s + row_term(base, c); }
  return reduce_sum(t, s);
}

// row_sum at WG 8 on one thread (a direct entry point's): lane l sums thread l's strided terms
// c = l, l + 8, ... in the same order, and lanes whose thread had no term in the last round add
// nothing; then reduce_sum's tree (tree8_sum). The same additions in the same order, each term
// added in the same expression: the same bits (tests/unit/gpu/test_kernels.py, on SwiftShader and GPUs).
fn row_sum8(base: u32) -> f32 {
  var lo = vec4<f32>(0.0);
  var hi = vec4<f32>(0.0);
  let full = dims.C & ~7u;
  for (var c = 0u; c < full; c = c + 8u) {
    lo = lo + vec4<f32>(row_term(base, c), row_term(base, c + 1u), row_term(base, c + 2u),
                        row_term(base, c + 3u));
    hi = hi + vec4<f32>(row_term(base, c + 4u), row_term(base, c + 5u), row_term(base, c + 6u),
                        row_term(base, c + 7u));
  }
  // The last round: lane l adds its term as thread l does, `s + row_term(...)` in one
  // expression (a GPU's compiler may fuse that multiply-add; a lane loop over a dynamic index
  // compiled to an unfused one on an H100 and changed the bits where C % 8 != 0).
  let n = dims.C - full;
  if (n > 0u) { lo.x = lo.x + row_term(base, full); }
  if (n > 1u) { lo.y = lo.y + row_term(base, full + 1u); }
  if (n > 2u) { lo.z = lo.z + row_term(base, full + 2u); }
  if (n > 3u) { lo.w = lo.w + row_term(base, full + 3u); }
  if (n > 4u) { hi.x = hi.x + row_term(base, full + 4u); }
  if (n > 5u) { hi.y = hi.y + row_term(base, full + 5u); }
  if (n > 6u) { hi.z = hi.z + row_term(base, full + 6u); }
  return tree8_sum(lo, hi);
}
