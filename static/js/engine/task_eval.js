// A toy task's exact-match accuracy (server/tasks.py): a row of a task batch is problems
// laid end to end from its first token, each `problem_len` tokens with its answer at
// [answer_start, answer_start + answer_len). Position t's logits predict token t + 1, so a
// problem is answered exactly when the argmax at each answer token's previous position is that
// token: greedy decoding from the prompt then writes the whole answer (the same prefixes),
// and one forward over a held-out batch measures it. Python's twin: tasks.exact_match.

/** Argmax of each of the N rows of `logits` ([N, V], f32): Int32Array [N] (the first maximum). */
export function argmaxRows(logits, V) {
  const N = logits.length / V;
  const out = new Int32Array(N);
  for (let n = 0; n < N; n++) {
    let best = 0;
    let max = logits[n * V];
    for (let v = 1; v < V; v++) {
      const x = logits[n * V + v];
      if (x > max) { max = x; best = v; }
    }
    out[n] = best;
  }
  return out;
}

/** {right, total} problems of a batch: predicted [B*T] (argmaxRows), targets [B*T] (row-major,
 *  targets[b*T + t] = token t + 1 of row b), facts the task's ({problem_len, answer_start,
 *  answer_len}). Only problems whose whole answer lies in the row count. */
export function exactMatch(predicted, targets, B, T, facts) {
  const { problem_len: L, answer_start: a, answer_len: n } = facts;
  let right = 0;
  let total = 0;
  for (let s = 0; s + a + n <= T + 1; s += L) {
    for (let b = 0; b < B; b++) {
      let ok = true;
      for (let p = s + a; p < s + a + n && ok; p++) ok = predicted[b * T + p - 1] === targets[b * T + p - 1];
      right += ok;
      total++;
    }
  }
  return { right, total };
}
