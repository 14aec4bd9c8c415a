// 08_norm_backward: gradients of RMSNorm y = g * x * r, r = rsqrt(mean(x^2) + eps).
//
// rmsnorm_backward_input (one workgroup per row, WG threads)
//   dx = r * (g * dy) - x * r^3 * mean(g * dy * x)
//   @binding(0) dims : {N rows, C}            uniform
//   @binding(1) dy   : array<f32> [N, C]      read
//   @binding(2) x    : array<f32> [N, C]      read (the norm's input)
//   @binding(3) g    : array<f32> [C]         read
//   @binding(4) rstd : array<f32> [N]         read
//   @binding(5) dx   : array<f32> [N, C]      = dx, or += dx with ACCUM (the residual grad)
//   Dispatch: N workgroups (2-D when over 65535).
// rmsnorm_backward_input_direct: the same at WG 8 with a row per thread (row_sum8), for a
//   software adapter (kernels.js): no workgroup memory or barriers, the same bits.
//   Dispatch: grid1d(ceil(N / DWG)) workgroups of DWG threads.
//
// rmsnorm_backward_gain: dg[c] += sum_n dy[n, c] * x[n, c] * r[n], in two deterministic passes
// (fixed-order sums, no atomics), so the rows are spread over many workgroups:
//   gain_partial  (ceil(C / WG), ceil(N / ROWS)) workgroups: part[k, c] = sum over rows
//                 [k * ROWS, (k + 1) * ROWS) of dy * x * r     (bindings 0, 1, 2, 4, 6: =)
//   gain_finish   ceil(C / WG) workgroups: dg[c] += sum_k part[k, c]   (bindings 0, 5, 6: +=)
//   @binding(6) part : array<f32> [ceil(N / ROWS), C]  scratch

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it
override ACCUM: bool = false;

struct Dims { N: u32, C: u32, ROWS: u32, CHUNKS: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

//#include "lib/row_sum.wgsl"
//#include "lib/common.wgsl"

fn row_term(base: u32, c: u32) -> f32 {   // the row's sum of g * dy * x
  return g[c] * dy[base + c] * x[base + c];
}

@compute @workgroup_size(WG)
fn rmsnorm_backward_input(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) t: u32) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= dims.N) { return; }
  let base = row * dims.C;
  let total = row_sum(t, base);
  let r = rstd[row];
  let coef = r * r * r * total / f32(dims.C);
  for (var c = t; c < dims.C; c = c + WG) {
    let d = r * g[c] * dy[base + c] - x[base + c] * coef;
    if (ACCUM) { out[base + c] = out[base + c] + d; } else { out[base + c] = d; }
  }
}

@compute @workgroup_size(DWG)
fn rmsnorm_backward_input_direct(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = flat_id(gid, nwg, DWG);
  if (row >= dims.N) { return; }
  let base = row * dims.C;
  let total = row_sum8(base);
  let r = rstd[row];
  let coef = r * r * r * total / f32(dims.C);
  for (var c = 0u; c < dims.C; c = c + 1u) {
    let d = r * g[c] * dy[base + c] - x[base + c] * coef;
    if (ACCUM) { out[base + c] = out[base + c] + d; } else { out[base + c] = d; }
  }
}

@compute @workgroup_size(WG)
fn gain_partial(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  let k = gid.y;
  if (c >= dims.C || k >= dims.CHUNKS) { return; }
  // Four running sums (rows n, n + 1, n + 2, n + 3 mod 4) so that four rows' loads are in
  // flight at once: one sum's chain of dependent adds left the loop waiting on memory.
  var s = vec4<f32>(0.0);
  let end = min(dims.N, (k + 1u) * dims.ROWS);
  var n = k * dims.ROWS;
  for (; n + 3u < end; n = n + 4u) {
    s = s + vec4<f32>(gain_term(n, c), gain_term(n + 1u, c), gain_term(n + 2u, c),
                      gain_term(n + 3u, c));
  }
  for (; n < end; n = n + 1u) { s.x = s.x + gain_term(n, c); }
  part[k * dims.C + c] = (s.x + s.y) + (s.z + s.w);
}

fn gain_term(n: u32, c: u32) -> f32 {
  return dy[n * dims.C + c] * x[n * dims.C + c] * rstd[n];
}

@compute @workgroup_size(WG)
fn gain_finish(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  if (c >= dims.C) { return; }
  // Four running sums, as in gain_partial.
  var s = vec4<f32>(0.0);
  var k = 0u;
  for (; k + 3u < dims.CHUNKS; k = k + 4u) {
    s = s + vec4<f32>(part[k * dims.C + c], part[(k + 1u) * dims.C + c],
                      part[(k + 2u) * dims.C + c], part[(k + 3u) * dims.C + c]);
  }
  for (; k < dims.CHUNKS; k = k + 1u) { s.x = s.x + part[k * dims.C + c]; }
  out[c] = out[c] + ((s.x + s.y) + (s.z + s.w));
}
