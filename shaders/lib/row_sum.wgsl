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
