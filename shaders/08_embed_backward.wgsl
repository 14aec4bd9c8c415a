// 08_embed_backward: dWte[v, :] += sum of dx rows whose token is v.
// The rows of each token are listed beforehand by a counting sort on the CPU (kernels.js
// tokenBuckets, written with every batch), as llm.c's encoder backward buckets them: one
// workgroup per vocabulary row adds that row's dx rows in increasing position with its threads
// spread over the channels. No atomics, so the sum order is fixed and runs are bitwise
// reproducible; it is the order of a plain loop over positions. Cost: N * C adds, coalesced.
//
//   @binding(0) dims   : {N = B*T, C, V}     uniform
//   @binding(1) buckets: array<u32> [V + 1 + N]: start[v] (v <= V; start[V] = N), then the
//                        positions n grouped by token, increasing within a token
//   @binding(2) dx     : array<f32> [N, C]   read (gradient of the embedding output)
//   @binding(3) dwte   : array<f32> [V, C]   += (tied with the LM head, which adds first)
// Dispatch: V workgroups (2-D when over 65535) of WG threads.

override WG: u32;   // workgroup size: the launcher passes it and sizes its grid with it

struct Dims { N: u32, C: u32, V: u32, pad: u32 }

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> buckets: array<u32>;
@group(0) @binding(2) var<storage, read> dx: array<f32>;
@group(0) @binding(3) var<storage, read_write> dwte: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let v = wid.x + wid.y * nwg.x;
  if (v >= dims.V) { return; }
  let first = buckets[v];
  let last = buckets[v + 1u];
  if (first == last) { return; }  // a token absent from the batch: its row is untouched
  let pos = dims.V + 1u;          // where the positions begin
  for (var c = t; c < dims.C; c = c + WG) {
    var s = dwte[v * dims.C + c];
    for (var k = first; k < last; k = k + 1u) { s = s + dx[buckets[pos + k] * dims.C + c]; }
    dwte[v * dims.C + c] = s;
  }
}
