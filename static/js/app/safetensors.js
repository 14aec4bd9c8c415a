// A run's weights as the server serves them (GET /api/runs/{id}/model.safetensors: Hugging Face
// safetensors, f32, the parameter table's names) back into the engine's flat W: each tensor at
// its table offset, the padding between tensors zero. No DOM: tests/js runs it under Node.

/** The flat W [total_numel] (Float32Array) of `buffer` (an ArrayBuffer of a safetensors file)
 *  for `layout`; throws naming a tensor that is missing, not F32 or of another size. */
export function flatWeights(buffer, layout) {
  const view = new DataView(buffer);
  const headerLen = Number(view.getBigUint64(0, true));
  if (8 + headerLen > buffer.byteLength) throw new Error('not a safetensors file: its header is cut');
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, headerLen)));
  const data = 8 + headerLen;
  const out = new Float32Array(layout.total_numel);
  for (const p of layout.params) {
    const t = header[p.name];
    if (!t) throw new Error(`the weights have no tensor ${p.name}`);
    const [begin, end] = t.data_offsets;
    if (t.dtype !== 'F32' || end - begin !== p.numel * 4) {
      throw new Error(`tensor ${p.name} is ${t.dtype} of ${end - begin} bytes, not F32 of ${p.numel * 4}`);
    }
    // (An offset that is not a multiple of 4 cannot be a Float32Array view: copied bytes.)
    const bytes = new Uint8Array(buffer, data + begin, end - begin);
    out.set(new Float32Array(bytes.slice().buffer), p.offset);
  }
  return out;
}
