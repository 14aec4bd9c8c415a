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

/** The engine's ops (kernels.js, as a step launches them) for shape s over bufs {x, w, dy, y, dx,
 *  dw, part}: forward y = x W^T, input gradient dx = dy W, or weight gradient dW += dy^T x. */
export async function engineOps(kernels, s, bufs) {
  const { M, N, K } = s;
  let r;
  if (s.kind === 'fwd') r = await kernels.linear({ x: bufs.x, w: bufs.w, y: bufs.y, M, N, K });
  else if (s.kind === 'dx') r = await kernels.linearBackwardInput({ dy: bufs.dy, w: bufs.w, dx: bufs.dx, M, N, K });
  else r = await kernels.linearBackwardWeight({ dy: bufs.dy, x: bufs.x, dw: bufs.dw, part: bufs.part, M, N, K });
  return Array.isArray(r) ? r : [r];
}
