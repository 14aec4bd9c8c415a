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
// nothing; then reduce_sum's tree (tree8_sum). The same additions in the same order: the same bits.
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
  for (var l = 0u; l < dims.C - full; l = l + 1u) {
    let v = row_term(base, full + l);
    if (l < 4u) { lo[l] = lo[l] + v; } else { hi[l - 4u] = hi[l - 4u] + v; }
  }
  return tree8_sum(lo, hi);
}
