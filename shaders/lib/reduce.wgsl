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
