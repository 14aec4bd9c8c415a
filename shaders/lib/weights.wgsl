// Weight reads from `w: array<u32>`: f32 bits, or the packed f16 mirror when W_F16 is set
// (written by adamw_update_f16 with pack2x16float; element e lives in half e & 1 of word e / 2).
fn load_w(e: u32) -> f32 {
  if (W_F16) { return unpack2x16float(w[e >> 1u])[e & 1u]; }
  return bitcast<f32>(w[e]);
}
