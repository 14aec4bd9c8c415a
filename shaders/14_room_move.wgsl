// 14_room_move: an overlapped room worker's move onto the next version, where the weights are
// (static/js/engine/room_gpu.js; room_worker.js's rebase does the same on the CPU). At a
// round's end the weights e_r are copied aside (`since`); the worker trains on; when version
// r + 1 arrives the steps since e_r are taken (since = weights - since), the version is set and
// its eval measured, and the weights become version + since. Both are one correctly rounded f32
// `-` or `+` an element (no product: nothing for a compiler to fuse), so the result is the CPU's
// Math.fround(version + Math.fround(weights - end)) bit for bit. A mixed run's f16 mirror is
// rewritten from the moved weights as the optimizer's step writes it (pack2x16float).
//
//   @binding(0) p       : {numel, pairs (ceil(numel / 2))}   uniform
//   @binding(1) weights : array<f32> [numel]   the model's weights (model.W)
//   @binding(2) version : array<f32> [numel]   the version just set (the one held)
//   @binding(3) since   : array<f32> [numel]   e_r, then the steps since it
//   @binding(4) mirror  : array<u32> [pairs]   the f16 mirror: element i in half i % 2 of word i / 2
// Dispatch: steps_since over ceil(numel / WG) workgroups, move_onto(_f16) over ceil(pairs / WG)
// (2-D when over 65535).

//#include "lib/common.wgsl"

override WG: u32;

struct Params { numel: u32, pairs: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> weights: array<f32>;
@group(0) @binding(2) var<storage, read> version: array<f32>;
@group(0) @binding(3) var<storage, read_write> since: array<f32>;
@group(0) @binding(4) var<storage, read_write> mirror: array<u32>;

// since = weights - e_r: the steps trained since the round's end.
@compute @workgroup_size(WG)
fn steps_since(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = flat_id(gid, nwg, WG);
  if (i >= p.numel) { return; }
  since[i] = weights[i] - since[i];
}

fn moved(i: u32) -> f32 {
  if (i >= p.numel) { return 0.0; }     // a mirror's odd tail: its high half is 0, as packHalf2's
  let w = version[i] + since[i];
  weights[i] = w;
  return w;
}

// weights = version + since, two elements a thread (the mirror's word).
@compute @workgroup_size(WG)
fn move_onto(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
  let k = flat_id(gid, nwg, WG);
  if (k >= p.pairs) { return; }
  _ = moved(2u * k);
  _ = moved(2u * k + 1u);
}

// move_onto, and the f16 mirror of the two moved weights.
@compute @workgroup_size(WG)
fn move_onto_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
  let k = flat_id(gid, nwg, WG);
  if (k >= p.pairs) { return; }
  mirror[k] = pack2x16float(vec2<f32>(moved(2u * k), moved(2u * k + 1u)));
}
