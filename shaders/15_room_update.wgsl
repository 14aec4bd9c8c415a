// 15_room_update: an int8 room's next version applied where the weights are
// (static/js/engine/room_gpu_delta.js): the server sends version v as an update of v - 1 in the
// int8 body (server/room/close.py Update; room_codec.js applyUpdate is the CPU's), and the
// worker holds v - 1 on the GPU: version += f32(code) * scale, the weights set to it (and a
// mixed run's f16 mirror with them, as the optimizer's step writes it). The server's version is
// that product rounded, then the sum rounded; a compiler may fuse a product into the sum that
// follows it (one rounding, other bits), so the product goes through an xor with the uniform
// `zero`, which no compiler can see through. tests/unit/gpu/test_room_update.py holds the
// result to numpy's bit for bit.
//
//   @binding(0) p       : {numel, pairs (ceil(numel / 2)), blocks, zero (0)}   uniform
//   @binding(1) body    : array<u32>   the update: scales f32 [blocks], then the int8 codes
//                                      [numel], four a word (little-endian), zero-padded
//   @binding(2) version : array<f32> [numel]   v - 1, then v
//   @binding(3) weights : array<f32> [numel]   = v
//   @binding(4) mirror  : array<u32> [pairs]   = v as f16, element i in half i % 2 of word i / 2
// Dispatch: ceil(pairs / WG) workgroups (2-D when over 65535), two elements a thread.

//#include "lib/common.wgsl"

override WG: u32;

const BLOCK: u32 = 256u;

struct Params { numel: u32, pairs: u32, blocks: u32, zero: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> body: array<u32>;
@group(0) @binding(2) var<storage, read_write> version: array<f32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;
@group(0) @binding(4) var<storage, read_write> mirror: array<u32>;

fn updated(i: u32) -> f32 {
  if (i >= p.numel) { return 0.0; }     // a mirror's odd tail: its high half is 0, as packHalf2's
  let scale = bitcast<f32>(body[i / BLOCK]);
  let word = body[p.blocks + i / 4u];
  let code = extractBits(bitcast<i32>(word), 8u * (i % 4u), 8u);   // sign-extended
  let step = bitcast<f32>(bitcast<u32>(f32(code) * scale) ^ p.zero);   // rounded on its own
  let v = version[i] + step;
  version[i] = v;
  weights[i] = v;
  return v;
}

@compute @workgroup_size(WG)
fn apply_update(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
  let k = flat_id(gid, nwg, WG);
  if (k >= p.pairs) { return; }
  _ = updated(2u * k);
  _ = updated(2u * k + 1u);
}

// apply_update, and the f16 mirror of the two new weights.
@compute @workgroup_size(WG)
fn apply_update_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
  let k = flat_id(gid, nwg, WG);
  if (k >= p.pairs) { return; }
  mirror[k] = pack2x16float(vec2<f32>(updated(2u * k), updated(2u * k + 1u)));
}
