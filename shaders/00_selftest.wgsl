// 00_selftest: checks that compute, storage buffers and workgroup memory work at all.
//
// Bindings:
//   @binding(0) x   : array<f32>  [n]   read
//   @binding(1) out : array<f32>  [n]   = 2 * x[i] + 1
//   @binding(2) sums: array<f32>  [nwg] = sum of x over each workgroup's slice (tree reduction)
// Dispatch: ceil(n / WG) workgroups of WG threads.

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> sums: array<f32>;

var<workgroup> sh: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
  let n = arrayLength(&x);
  let i = gid.x;
  var v = 0.0;
  if (i < n) {
    v = x[i];
    out[i] = 2.0 * v + 1.0;
  }
  sh[tid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) { sh[tid] = sh[tid] + sh[tid + s]; }
    workgroupBarrier();
  }
  if (tid == 0u) { sums[wid.x] = sh[0]; }
}
