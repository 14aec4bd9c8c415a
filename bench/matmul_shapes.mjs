// The matmul shapes of one training step, for the matmul benches (bench_matmul.mjs,
// bench_matmul_f16.mjs; bench_matmul_torch.py lists the same).

/** The matmuls of one training step: [name, kind, M, N, K, calls] with the launcher's M, N, K. */
export function stepShapes(cfg, rows) {
  const C = cfg.n_embd;
  const F = cfg.ffn_dim;
  const V = cfg.vocab_size;
  const L = cfg.n_layer;
  const out = [];
  for (const [name, n, k, calls] of [['qkv', 3 * C, C, L], ['o', C, C, L], ['gate_up', 2 * F, C, L],
    ['down', C, F, L], ['head', V, C, 1]]) {
    for (const kind of ['fwd', 'dx', 'dW']) out.push({ name, kind, M: rows, N: n, K: k, calls });
  }
  return out;
}
