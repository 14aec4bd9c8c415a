// 13_room_delta: a room worker's int8 pseudo-gradient made on the GPU (server/room/codec.py's
// int8 body; static/js/engine/room_codec.js makes the same on the CPU): per element the f32
// difference version - weights, per block of 256 the scale absmax / 127 and the codes
// round(d / scale) (half to even), clamped to +-127, four codes a u32 (little-endian bytes: the
// body's byte order). Reading back codes and scales moves a quarter of the weights' bytes.
// WGSL's f32 `-` is correctly rounded as numpy's is; its `/` is within 2.5 ulp, so a scale may
// differ from numpy's in its last bits and a code by one where the quotient is that near a tie.
//
//   @binding(0) p       : {numel, blocks_x (the grid's x: blocks are wg.y * blocks_x + wg.x)} uniform
//   @binding(1) version : array<f32> [numel]          the version the worker holds
//   @binding(2) weights : array<f32> [numel]          its weights now
//   @binding(3) scales  : array<f32> [blocks]         = absmax / 127 of each block
//   @binding(4) codes   : array<u32> [blocks * 64]    = the codes, 4 a word (0 past numel)
// Dispatch: one workgroup of 64 threads per block of 256 (2-D over 65535 blocks).

struct Params { numel: u32, blocks_x: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> version: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read_write> scales: array<f32>;
@group(0) @binding(4) var<storage, read_write> codes: array<u32>;

const BLOCK: u32 = 256u;
const INT8_MAX: f32 = 127.0;

var<workgroup> peak: array<f32, 64>;

@compute @workgroup_size(64)
fn encode_int8(@builtin(workgroup_id) wg: vec3<u32>,
               @builtin(local_invocation_index) t: u32) {
  // Uniform per workgroup (workgroup_id and the uniform): the barriers below are reached by all.
  let block = wg.y * p.blocks_x + wg.x;
  if (block * BLOCK >= p.numel) { return; }
  let base = block * BLOCK + 4u * t;
  var d = vec4<f32>(0.0);
  for (var k = 0u; k < 4u; k++) {
    if (base + k < p.numel) { d[k] = version[base + k] - weights[base + k]; }
  }
  let a = abs(d);
  peak[t] = max(max(a.x, a.y), max(a.z, a.w));
  workgroupBarrier();
  for (var s = 32u; s > 0u; s >>= 1u) {
    if (t < s) { peak[t] = max(peak[t], peak[t + s]); }
    workgroupBarrier();
  }
  let scale = peak[0] / INT8_MAX;
  if (t == 0u) { scales[block] = scale; }
  let safe = select(1.0, scale, scale > 0.0);
  let q = vec4<i32>(clamp(round(d / safe), vec4<f32>(-INT8_MAX), vec4<f32>(INT8_MAX)));
  let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
  codes[block * 64u + t] = b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}
