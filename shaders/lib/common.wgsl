// Shared helpers. Grids over 65535 workgroups are 2-D; flat_id linearises them.

fn flat_id(gid: vec3<u32>, nwg: vec3<u32>, wg: u32) -> u32 {
  return gid.x + gid.y * nwg.x * wg;
}
