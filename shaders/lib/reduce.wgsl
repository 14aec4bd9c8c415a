// Workgroup reductions (fixed tree order: deterministic). The including file declares the
// `override WG: u32` workgroup size (a power of two); every thread of the workgroup must call.
var<workgroup> red: array<f32, WG>;

fn reduce_sum(t: u32, v: f32) -> f32 {
  red[t] = v;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k = k >> 1u) {
    if (t < k) { red[t] = red[t] + red[t + k]; }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();   // red is free for the next call
  return r;
}

fn reduce_max(t: u32, v: f32) -> f32 {
  red[t] = v;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k = k >> 1u) {
    if (t < k) { red[t] = max(red[t], red[t + k]); }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();
  return r;
}

// The trees above at WG 8, on one thread that holds the 8 threads' values (lanes 0-3 in lo, 4-7
// in hi): the row kernels' direct entry points (a software adapter's, kernels.js), one thread a
// row, DWG rows a workgroup. The same operations in the same order as reduce_sum / reduce_max
// at WG 8, so the same bits.
override DWG: u32 = 64u;

fn tree8_sum(lo: vec4<f32>, hi: vec4<f32>) -> f32 {
  let a = lo + hi;       // k = 4: red[t] + red[t + 4], t < 4
  let b = a.xy + a.zw;   // k = 2
  return b.x + b.y;      // k = 1
}

fn tree8_max(lo: vec4<f32>, hi: vec4<f32>) -> f32 {
  let a = max(lo, hi);
  let b = max(a.xy, a.zw);
  return max(b.x, b.y);
}
