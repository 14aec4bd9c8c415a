// The embedding backward's input: the batch's positions grouped by token (08_embed_backward).

/** u32 words of tokenBuckets for N tokens of a V-token vocabulary. */
export const tokenBucketsNumel = (N, V) => V + 1 + N;

/** The batch's positions grouped by token, for the embedding backward (08_embed_backward):
 *  a stable counting sort on the CPU, O(N + V), as llm.c buckets its encoder backward. Returns
 *  `out` (a Uint32Array of tokenBucketsNumel(N, V), reused across batches) holding start[v] for
 *  v <= V (start[V] = N), then the positions of token 0, of token 1, ... each increasing. */
export function tokenBuckets(tokens, V, out = new Uint32Array(V + 1 + tokens.length)) {
  const N = tokens.length;
  if (out.length !== tokenBucketsNumel(N, V)) throw new Error('tokenBuckets: wrong out length');
  out.fill(0, 0, V + 1);
  for (let n = 0; n < N; n++) out[tokens[n]] += 1;          // counts
  for (let v = 1; v < V; v++) out[v] += out[v - 1];         // end[v]
  out[V] = N;
  // Backwards, each position to its token's last free slot: end[v] falls to start[v], and the
  // positions of a token stay increasing.
  const positions = out.subarray(V + 1);
  for (let n = N - 1; n >= 0; n--) positions[--out[tokens[n]]] = n;
  return out;
}
