// RoPE's table (04_rope.wgsl), as Hugging Face's LlamaRotaryEmbedding computes it.

/** RoPE cos/sin table [T, D/2, 2] as Hugging Face computes it: inv_freq and the angle in f32. */
export function ropeTable(T, D, theta) {
  const half = D / 2;
  const table = new Float32Array(T * half * 2);
  const f = Math.fround;
  for (let j = 0; j < half; j++) {
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in float32.
    const invFreq = f(1 / f(theta ** f((2 * j) / D)));
    for (let t = 0; t < T; t++) {
      const angle = f(t * invFreq);
      table[(t * half + j) * 2] = Math.cos(angle);
      table[(t * half + j) * 2 + 1] = Math.sin(angle);
    }
  }
  return table;
}
