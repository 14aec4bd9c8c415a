// Text generation from the model as it learns: forward over a [1, W] window, read only the
// last position's logits, sample with temperature. Occasional and small, so it reads back
// synchronously (the trainer runs it between steps).

/** Mulberry32: a tiny seeded PRNG so samples are reproducible for a (run, step). */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WINDOW_STEP = 64;   // window lengths come in steps of this: few plans, little padding

/** `n` new token ids after `prompt` (ids), keeping the last `window` tokens as context. The
 *  window defaults to the shortest multiple of 64 that holds prompt and continuation (at most
 *  the model's T): causal attention makes a position's logits independent of what follows it,
 *  so a short window gives the same ids as the full T at a fraction of the cost (a 56-token
 *  sample of 120m: a [1, 64] forward instead of [1, 1024]). */
export async function generate(model, prompt, n, opts = {}) {
  return (await generateTokens(model, prompt, n, opts)).map((t) => t.id);
}

/** generate's tokens one by one: [{id, p}] with p the model's probability of the token (its
 *  softmax at temperature 1, before top-k), each handed to onToken as it comes (a prompt box
 *  streams them). topK > 0 samples among the K most likely only; temperature 0 is greedy. */
export async function generateTokens(model, prompt, n, { temperature = 0.8, topK = 0, seed = 0,
  window = null, onToken = () => {} } = {}) {
  const { seq_len: T } = model.config;
  const W = window ?? Math.min(T, Math.ceil((prompt.length + n) / WINDOW_STEP) * WINDOW_STEP);
  const plan = await model.plan(1, W);
  const random = rng(seed);
  const ids = [...prompt];
  const out = [];
  const buf = new Uint32Array(W);
  for (let i = 0; i < n; i++) {
    const ctx = ids.slice(-W);
    buf.fill(0);
    buf.set(ctx);
    model.writeBatch(plan, buf);
    model.submit(plan.forward);
    // Causal attention: padding after the context cannot change the last real position. Only
    // its row is read (its loss chunk's lm head runs where the plan has several: Model.logitRows).
    const row = await model.logitRows(plan, ctx.length - 1, 1);
    const id = sampleRow(row, temperature, topK, random);
    const t = { id, p: softmaxAt(row, id) };
    ids.push(id);
    out.push(t);
    onToken(t, i);
  }
  return out;
}

function softmaxAt(logits, id) {
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x);
  let sum = 0;
  for (const x of logits) sum += Math.exp(x - max);
  return Math.exp(logits[id] - max) / sum;
}

function sampleRow(logits, temperature, topK, random) {
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x);
  if (!(temperature > 0)) return logits.indexOf(max);
  // Top-k: the k-th largest logit is the floor (ties at it all stay in).
  const floor = topK > 0 && topK < logits.length
    ? Float32Array.from(logits).sort().reverse()[topK - 1] : -Infinity;
  const p = new Float64Array(logits.length);
  let sum = 0;
  for (let v = 0; v < logits.length; v++) {
    p[v] = logits[v] >= floor ? Math.exp((logits[v] - max) / temperature) : 0;
    sum += p[v];
  }
  let r = random() * sum;
  for (let v = 0; v < p.length; v++) { r -= p[v]; if (p[v] > 0 && r <= 0) return v; }
  return logits.indexOf(max);
}
