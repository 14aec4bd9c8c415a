// The Llama model on the GPU: weights W and grads G in two mega-buffers laid out by the
// parameter table (server/model.py, received as `layout`, never re-derived here), and per
// (B, T) a plan: activation buffers plus the forward and backward op lists, built once.
//
// Legend: B batch, T time, C channels, L layers, H heads, D = C / H, F FFN width, V vocab,
// N = B * T rows.

import { readBuffer, storageBuffer } from './gpu.js';
import { Kernels, attentionDsNumel, gainPartialNumel, lossFloats } from './kernels.js';
import { weightGradPartNumel } from './matmul_tiles.js';
import { ropeTable } from './rope.js';
import { tokenBuckets, tokenBucketsNumel } from './token_buckets.js';
import { copyOp, encodeOps, releaseOps, view } from './ops.js';

/** Bytes the adapter binds in one storage buffer. */
const bindLimit = (limits) => Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);

// Loss chunks start on multiples of this many rows: a chunk's views of the [N, C] rows (the final
// norm's output, its gradient) then start on a multiple of 64 x 4 = 256 bytes, WebGPU's storage
// offset alignment, whatever C.
const CHUNK_ALIGN = 64;

/** Rows per loss chunk of an N-row batch over V logits a row: the lm head and the loss run a
 *  chunk at a time through one [rows, V] logits buffer (Model.buildOps). One chunk (rows = N)
 *  wherever the [N, V] logits bind; else the fewest that do, of equal rows rounded up to a
 *  multiple of CHUNK_ALIGN (the last chunk takes what is left). The budget is the binding limit
 *  and nothing lower: a plan that binds today keeps its ops, bit for bit and at full speed, and
 *  the logits are about a sixth of a plan's activations (12m; the FFN's gu and h over its six
 *  layers take a third), so capping them lower would save little; chunks are for the batches
 *  that could not run at all. Without limits (the new-run page before it knows the adapter): one. */
export function lossChunkRows(N, V, limits = null) {
  const bind = limits ? bindLimit(limits) : Infinity;
  if (N * V * 4 <= bind) return N;
  const most = Math.floor(bind / (4 * V * CHUNK_ALIGN)) * CHUNK_ALIGN;   // whole aligned rows
  if (most === 0) return CHUNK_ALIGN;   // not even these bind: limitProblems says so
  const chunks = Math.ceil(N / most);
  return Math.ceil(N / chunks / CHUNK_ALIGN) * CHUNK_ALIGN;
}

/** The loss chunks of N rows at `rows` a chunk: [first row, row count] each. */
export function lossChunks(N, rows) {
  if (N > 0 && !(rows >= 1)) throw new Error(`loss chunks of ${rows} rows`);
  const chunks = [];
  for (let r0 = 0; r0 < N; r0 += rows) chunks.push([r0, Math.min(rows, N - r0)]);
  return chunks;
}

/** Every activation buffer of a (B, T) plan: [name, f32 elements, per-layer count or null].
 *  The plan allocates exactly these, and the new-run page sums them for its memory estimate.
 *  limits: the adapter's, where known; the attention backward's dS buffer is full size only
 *  where they bind it (without limits: assumed to), and the logits hold one loss chunk's rows
 *  (lossChunkRows; `rows` overrides it). */
export function activationShapes(config, B, T, limits = null, mixed = false,
  rows = lossChunkRows(B * T, config.vocab_size, limits)) {
  const { n_embd: C, n_layer: L, n_head: H, ffn_dim: F, vocab_size: V } = config;
  const N = B * T;
  const headMs = [...new Set(lossChunks(N, rows).map(([, n]) => n))];   // the lm head's M per chunk
  const ds = attentionDsNumel(B, T, H, mixed ? C / H : 0);
  const dsBinds = !limits || ds * 4 <= bindLimit(limits);
  return [
    ['tokens', N, null], ['targets', N, null],       // [B, T] u32
    ['buckets', tokenBucketsNumel(N, V), null],       // u32: positions by token (tokenBuckets)
    ['res', N * C, L + 1],                            // [N, C] residual stream, layer inputs
    ['resMid', N * C, L],                             // [N, C] after attention
    ['n1', N * C, L], ['rstd1', N, L],                // input_layernorm out, 1/rms
    ['n2', N * C, L], ['rstd2', N, L],                // post_attention_layernorm out, 1/rms
    ['qkv', N * 3 * C, L],                            // [N, 3C] q, k after RoPE; v
    ['att', N * C, L],                                // [N, C] attention output
    ['lse', B * H * T, L],                            // [B, H, T] softmax logsumexp
    ['gu', N * 2 * F, L],                             // [N, 2F] gate | up
    ['h', N * F, L],                                  // [N, F] silu(gate) * up
    ['nf', N * C, null], ['rstdf', N, null],          // final norm
    ['logits', Math.min(rows, N) * V, null],          // [rows, V] a loss chunk's, then dlogits in place
    ['losses', lossFloats(N), null],                  // 07_loss.wgsl's layout
    ['rope', T * (C / H), null],                      // [T, D/2, 2] cos, sin
    ['dres', N * C, null], ['dn', N * C, null], ['datt', N * C, null],   // backward scratch
    ['dqkv', N * 3 * C, null], ['delta', B * H * T, null],
    ['attnDs', dsBinds ? ds : 4, null],              // [B, H, T, T+] attention dS (kernels.js; f16 [B, H, T, T] mixed)
    ['dh', N * F, null], ['dgu', N * 2 * F, null],
    ['gainPart', gainPartialNumel(N, C), null],      // norm-gain gradient partial sums
    // split-K partials of the weight gradients: the [out, in] shapes of the backward's five
    // linearBackwardWeight calls (lm head over each loss chunk's rows; down, gate|up, o, q|k|v
    // over all N)
    ['wgradPart', Math.max(1, ...headMs.map((m) => weightGradPartNumel(m, V, C, mixed)),
      ...[[C, F], [2 * F, C], [C, C], [3 * C, C]].map(([n, k]) => weightGradPartNumel(N, n, k, mixed))),
    null],
  ];
}

/** Bytes of a (B, T) plan's activations, and the largest single one (limits, rows as above). */
export function activationBytes(config, B, T, limits = null, mixed = false,
  rows = lossChunkRows(B * T, config.vocab_size, limits)) {
  let total = 0;
  let largest = { name: null, bytes: 0 };
  for (const [name, numel, layers] of activationShapes(config, B, T, limits, mixed, rows)) {
    total += numel * 4 * (layers ?? 1);
    if (numel * 4 > largest.bytes) largest = { name, bytes: numel * 4 };
  }
  return { total, largest };
}

// The activations that grow largest, in the new-run form's words: what each holds, what its
// size is a product of, and the settings that shrink it (limitProblems names the one too large
// to bind). The rest are [N, C] rows of the residual stream's width.
const ACTIVATION_WORDS = {
  // The loss takes the logits in chunks that bind (lossChunkRows): too large only where the
  // smallest chunk's are.
  logits: ["the logits of the loss's smallest chunk", `${CHUNK_ALIGN} positions x vocabulary`,
    'the vocabulary'],
  gu: ["the FFN's gate and up projections", 'batch size x context x 2 x FFN width',
    'the batch size, the context or the FFN width'],
  h: ["the FFN's hidden activations", 'batch size x context x FFN width',
    'the batch size, the context or the FFN width'],
  qkv: ["attention's queries, keys and values", 'batch size x context x 3 x width',
    'the batch size, the context or the width'],
  attnDs: ["attention's score gradients", 'batch size x heads x context x context',
    'the batch size, the context or the heads'],
  wgradPart: ["the weight gradients' split sums", 'the largest weight x splits of batch size x context',
    'the batch size, the context, or the vocabulary, width or FFN width'],
};
ACTIVATION_WORDS.dgu = ACTIVATION_WORDS.gu;
ACTIVATION_WORDS.dh = ACTIVATION_WORDS.h;
ACTIVATION_WORDS.dqkv = ACTIVATION_WORDS.qkv;
const ROWS_WORDS = ['the residual stream', 'batch size x context x width', 'the batch size, the context or the width'];

/** Why this adapter cannot hold the model at (B, T), in words; empty when it can. */
export function limitProblems(layout, B, T, limits) {
  const bind = bindLimit(limits);
  const problems = [];
  const wBytes = layout.total_numel * 4;
  if (wBytes > bind) {
    problems.push(`the weights need one ${(wBytes / 2 ** 20).toFixed(0)} MiB buffer; this ` +
      `adapter binds at most ${(bind / 2 ** 20).toFixed(0)} MiB`);
  }
  const { largest } = activationBytes(layout.config, B, T, limits);
  if (largest.bytes > bind) {
    const [what, product, lower] = ACTIVATION_WORDS[largest.name] ?? ROWS_WORDS;
    problems.push(`${what} (${product}) at batch size ${B} x context ${T}: one ` +
      `${(largest.bytes / 2 ** 20).toFixed(0)} MiB buffer, and this adapter binds at most ` +
      `${(bind / 2 ** 20).toFixed(0)} MiB: lower ${lower}`);
  }
  const maxD = layout.limits.max_head_dim;   // server/model.py MAX_HEAD_DIM
  if (layout.config.head_dim > maxD) problems.push(`head dim over ${maxD} is not supported`);
  return problems;
}

/** Per tensor name, the span {offset, numel} of W a matmul reads for it: the tensor, or for the
 *  first tensor of a fusion group of the layout (`group`: q|k|v, gate|up, laid back to back by
 *  server/model.py) the whole group, so one matmul computes the group's outputs side by side. */
export function matmulSpans(params) {
  const spans = Object.fromEntries(params.map((p) => [p.name, { offset: p.offset, numel: p.numel }]));
  const opened = new Map();   // group -> the span of its first tensor, grown by the others
  for (const p of params) {
    if (p.group === undefined) throw new Error(`${p.name}: the layout says no group (server/model.py)`);
    if (p.group === null) continue;
    const span = opened.get(p.group);
    if (!span) {
      opened.set(p.group, spans[p.name]);
    } else if (span.offset + span.numel !== p.offset) {
      throw new Error(`group ${p.group} is not contiguous at ${p.name}`);
    } else {
      span.numel += p.numel;
    }
  }
  return spans;
}

export class Model {
  /** ctx: {device, lib} from the lab or trainer; layout: the server's parameter table;
   *  precision: 'fp32', or 'mixed' (the linears' matmuls with f16 operands and f32 accumulation
   *  on the GPU's matrix units, mma.js; everything else, weights and gradients stay f32).
   *  lossRows: rows per loss chunk, a multiple of 64, instead of lossChunkRows' choice (tests
   *  and benches force chunks with it); null: lossChunkRows. */
  constructor(ctx, layout, { precision = 'fp32', lossRows = null } = {}) {
    this.ctx = ctx;
    this.device = ctx.device;
    this.layout = layout;
    this.config = layout.config;
    this.spans = matmulSpans(layout.params);
    if (!['fp32', 'mixed'].includes(precision)) throw new Error(`unknown precision ${precision}`);
    if (precision === 'mixed') {
      const { ok, why } = ctx.mixed ?? { why: 'its context was made without mixed (context.js)' };
      if (!ok) throw new Error(`mixed precision is not available on this adapter: ${why}`);
    }
    this.precision = precision;
    if (lossRows !== null && !(Number.isInteger(lossRows) && lossRows > 0 && lossRows % CHUNK_ALIGN === 0)) {
      throw new Error(`lossRows must be a positive multiple of ${CHUNK_ALIGN}, got ${lossRows}`);
    }
    this.lossRows = lossRows;
    this.k = new Kernels(ctx.device, ctx.lib, { maxHeadDim: layout.limits.max_head_dim,
      mixed: precision === 'mixed', software: ctx.software });
    const bytes = layout.total_numel * 4;
    this.W = storageBuffer(this.device, bytes, { label: 'W' });   // weights
    this.G = storageBuffer(this.device, bytes, { label: 'G' });   // gradients (+=, zeroed by AdamW)
    this.weightsF16 = null;  // the optimizer's f16 mirror when it is on (useOptimizer)
    this.lossScaler = null;  // mixed precision: the optimizer's loss scaler (useOptimizer)
    this.plans = new Map();  // `${B}x${T}` -> Promise<plan>
    this.built = new Set();  // plans whose buffers exist
    this.destroyed = false;
  }

  /** What the plans take from the optimizer that updates W: its f16 mirror of W (the matmuls
   *  read their weights there) and its loss scaler (dlogits *= the scale: mixed precision),
   *  either null. Given once, before the first plan: a plan made without them would read W
   *  and leave the loss unscaled, so a later call is refused. */
  useOptimizer({ mirror = null, scaler = null }) {
    if (this.plans.size) throw new Error('useOptimizer comes before the first plan');
    this.weightsF16 = mirror;
    this.lossScaler = scaler;
  }

  /** Frees W, G and every plan's activations and op uniforms (a plan still being built is
   *  freed when it is done). */
  destroy() {
    if (this.destroyed) return;
    this.destroyed = true;
    this.W.destroy();
    this.G.destroy();
    for (const plan of this.built) destroyPlan(plan);
    this.built.clear();
  }

  /** Sub-range of `buffer` (W or G) holding tensor `name`; for the first tensor of a fusion
   *  group, the whole group (matmulSpans). */
  t(buffer, name) {
    const p = this.spans[name];
    if (!p) throw new Error(`no tensor ${name} in the layout`);
    return view(buffer, p.offset, p.numel);
  }

  /** Weights as the matmuls read them: W's f32 sub-range, or with the mirror on, the same
   *  elements of the packed f16 mirror (2 bytes each; offsets stay 256-byte aligned). */
  tw(name) {
    if (!this.weightsF16) return this.t(this.W, name);
    const p = this.spans[name];
    return { buffer: this.weightsF16, offset: p.offset * 2, size: Math.ceil(p.numel / 2) * 4 };
  }

  /** Initialise W on the GPU from `seed`: normal(0, init_std) matrices, ones for norm gains. */
  async init(seed = 0) {
    const ops = await Promise.all(this.layout.params.map((p, stream) => this.k.init({
      w: view(this.W, p.offset, p.numel), numel: p.numel, seed, stream,
      mode: p.init === 'ones' ? 1 : 0, std: p.init_std,
    })));
    this.submit(ops);
    releaseOps(ops);   // submitted: the queue keeps what it needs
    this.device.queue.writeBuffer(this.G, 0, new Float32Array(this.layout.total_numel));
  }

  submit(ops) {
    const enc = this.device.createCommandEncoder();
    encodeOps(enc, ops);
    this.device.queue.submit([enc.finish()]);
  }

  /** The model's part of a checkpoint: W, f32 [total_numel] (server/optim.py
   *  checkpoint_sections names it; bytes = what W holds). */
  stateSections() {
    return [{ name: 'W', buffer: this.W, bytes: this.layout.total_numel * 4 }];
  }

  async getParams() { return new Float32Array(await readBuffer(this.device, this.W)); }
  async getGrads() { return new Float32Array(await readBuffer(this.device, this.G)); }

  setParams(values) {
    if (values.length !== this.layout.total_numel) {
      throw new Error(`setParams wants ${this.layout.total_numel} floats, got ${values.length}`);
    }
    this.device.queue.writeBuffer(this.W, 0, values);
  }

  /** Activations and op lists for batch shape (B, T); cached. */
  async plan(B, T) {
    const key = `${B}x${T}`;
    if (this.destroyed) throw new Error('the model was destroyed');
    if (!this.plans.has(key)) {
      this.plans.set(key, this.buildPlan(B, T).then((plan) => {
        if (this.destroyed) {
          destroyPlan(plan);
          throw new Error('the model was destroyed');
        }
        this.built.add(plan);
        return plan;
      }));
    }
    return this.plans.get(key);
  }

  async buildPlan(B, T) {
    const Tmax = this.config.seq_len;
    if (T > Tmax) throw new Error(`sequence length ${T} exceeds the model's ${Tmax}`);
    const problems = limitProblems(this.layout, B, T, this.ctx.limits);
    if (problems.length) throw new Error(`cannot plan batch ${B} x ${T}: ${problems.join('; ')}`);
    const N = B * T;
    const rows = Math.min(N, this.lossRows ?? lossChunkRows(N, this.config.vocab_size, this.ctx.limits));
    const a = {};  // activations kept for backward, and backward scratch
    for (const [name, numel, layers] of activationShapes(this.config, B, T, this.ctx.limits,
      this.k.mixed, rows)) {
      const make = (i) => storageBuffer(this.device, numel * 4, { label: layers ? `${name}${i}` : name });
      a[name] = layers ? [...Array(layers)].map((_, i) => make(i)) : make(0);
    }
    try {
      return await this.buildOps(a, B, T, rows);
    } catch (e) {
      destroyPlan({ acts: a, forward: [], loss: [], backward: [] });
      throw e;
    }
  }

  /** The op lists of a plan over activations `a`, the loss in chunks of `rows` rows:
   *  forward, then loss (the mean loss in losses[N]; G untouched: an eval runs forward + loss),
   *  then backward (gradients into G). With one chunk a step runs the three in that order. With
   *  more, logits holds one chunk at a time, so a step (plan.step) runs each chunk's lm head,
   *  loss and lm-head backward before the next chunk's: forward ends at the final norm, loss
   *  holds the chunks' lm heads and losses, backward starts with their lm-head backwards. The
   *  three lists still hold each op of a step once (what the profilers time and release frees). */
  async buildOps(a, B, T, rows) {
    const { n_embd: C, n_layer: L, n_head: H, ffn_dim: F, vocab_size: V,
      norm_eps: eps, rope_theta: theta } = this.config;
    const D = C / H;
    const N = B * T;
    this.device.queue.writeBuffer(a.rope, 0, ropeTable(T, D, theta));
    const k = this.k;
    const W = this.W;
    const G = this.G;
    const p = (i, s) => `model.layers.${i}.${s}.weight`;
    const wte = 'model.embed_tokens.weight';
    const f16 = Boolean(this.weightsF16);

    // A linear layer, y[N, n] = (or += with accum) x[N, kk] @ W^T with W [n, kk] the tensor
    // `name`, or the fusion group it opens (q|k|v and gate|up: the layout's `group`), and its
    // backward: dx = dy W, dW += dy^T x into G.
    const weight = (name, n, kk) => {
      if (this.spans[name]?.numel !== n * kk) {
        throw new Error(`${name}: the layout holds ${this.spans[name]?.numel} elements, not ${n} x ${kk}`);
      }
      return name;
    };
    // M: the rows x, y, dy and dx hold (a loss chunk's for the lm head; else all N).
    const linear = (x, name, y, n, kk, accum = false, M = N) => k.linear({ x,
      w: this.tw(weight(name, n, kk)), y, M, N: n, K: kk, accum, wF16: f16 });
    const linearBackward = (dy, x, name, dx, n, kk, M = N) => [
      k.linearBackwardInput({ dy, w: this.tw(weight(name, n, kk)), dx, M, N: n, K: kk,
        wF16: f16 }),
      k.linearBackwardWeight({ dy, x, dw: this.t(G, name), part: a.wgradPart,
        M, N: n, K: kk }),
    ];
    // An RMSNorm's backward from dn: its gain's gradient into G, and dx (= or += with accum).
    const normBackward = (x, rstd, name, dx, accum) => [
      k.rmsnormBackwardGain({ dy: a.dn, x, rstd, dg: this.t(G, name), part: a.gainPart, N, C }),
      k.rmsnormBackward({ dy: a.dn, x, g: this.t(W, name), rstd, dx, N, C, accum }),
    ];

    const forward = [
      k.embed({ tokens: a.tokens, wte: this.t(W, wte), x: a.res[0], N, C }),
    ];
    for (let i = 0; i < L; i++) {
      forward.push(
        k.rmsnorm({ x: a.res[i], g: this.t(W, p(i, 'input_layernorm')), y: a.n1[i],
          rstd: a.rstd1[i], N, C, eps }),
        linear(a.n1[i], p(i, 'self_attn.q_proj'), a.qkv[i], 3 * C, C),           // [N, 3C]
        k.rope({ qkv: a.qkv[i], table: a.rope, N, T, H, D }),
        k.attention({ qkv: a.qkv[i], y: a.att[i], lse: a.lse[i], B, T, H, D }),
        copyOp(a.res[i], a.resMid[i], N * C, 'fork residual'),
        linear(a.att[i], p(i, 'self_attn.o_proj'), a.resMid[i], C, C, true),     // resMid += o(att)
        k.rmsnorm({ x: a.resMid[i], g: this.t(W, p(i, 'post_attention_layernorm')), y: a.n2[i],
          rstd: a.rstd2[i], N, C, eps }),
        linear(a.n2[i], p(i, 'mlp.gate_proj'), a.gu[i], 2 * F, C),               // [N, 2F]
        k.swiglu({ gu: a.gu[i], h: a.h[i], N, F }),
        copyOp(a.resMid[i], a.res[i + 1], N * C, 'fork residual'),
        linear(a.h[i], p(i, 'mlp.down_proj'), a.res[i + 1], C, F, true),         // res += down(h)
      );
    }
    forward.push(
      k.rmsnorm({ x: a.res[L], g: this.t(W, 'model.norm.weight'), y: a.nf, rstd: a.rstdf,
        N, C, eps }),
    );

    // The lm head (tied wte) and the loss, a chunk of rows at a time (lossChunkRows): per chunk
    // the logits [n, V] of nf's rows, their losses (at the rows' batch indices, each the bits a
    // whole-batch loss gives: 07_loss.wgsl), dlogits in place, and the lm head's backward: dn's
    // rows, and wte's gradient += over the chunk's rows. Per row the matmuls sum in the same
    // order whatever their M (matmul_tiles.js, mma_ops.js: the tile changes no result), so a
    // row's logits, loss and dn are the same bits chunked or not; only wte's gradient sums its
    // rows in another order (chunk by chunk, each with its own split-K). Mixed precision with N
    // not a multiple of 16 is the exception: the whole batch then takes the fp32 matmuls, a
    // chunk of a multiple of 64 rows the matrix units.
    const chunks = lossChunks(N, rows);
    const rowsOf = (buf, r0, n) => (n === N ? buf : view(buf, r0 * C, n * C));   // [n, C] of [N, C]
    const head = chunks.map(([r0, n]) => ({
      forward: linear(rowsOf(a.nf, r0, n), wte, a.logits, V, C, false, n),        // [n, V]
      loss: k.crossEntropyRows({ logits: a.logits, targets: a.targets, losses: a.losses, N, V,
        row0: r0, rows: n }),
      scale: this.lossScaler && k.scaleDlogits({ logits: a.logits, scaler: this.lossScaler, N: n, V }),
      backward: linearBackward(a.logits, rowsOf(a.nf, r0, n), wte, rowsOf(a.dn, r0, n), V, C, n),
    }));
    const lossMean = k.lossMean({ losses: a.losses, N, V });
    const scaled = (h) => (h.scale ? [h.scale] : []);

    // Backward: the forward list in exact reverse, gradients into G (+=).
    const backward = [
      ...normBackward(a.res[L], a.rstdf, 'model.norm.weight', a.dres, false),
    ];
    for (let i = L - 1; i >= 0; i--) {
      backward.push(
        // res[i+1] = resMid + down(h): dres flows to resMid unchanged, and into down.
        ...linearBackward(a.dres, a.h[i], p(i, 'mlp.down_proj'), a.dh, C, F),
        k.swigluBackward({ gu: a.gu[i], dh: a.dh, dgu: a.dgu, N, F }),
        ...linearBackward(a.dgu, a.n2[i], p(i, 'mlp.gate_proj'), a.dn, 2 * F, C),
        ...normBackward(a.resMid[i], a.rstd2[i], p(i, 'post_attention_layernorm'), a.dres,
          true),                                                            // dres = d resMid
        ...linearBackward(a.dres, a.att[i], p(i, 'self_attn.o_proj'), a.datt, C, C),
        k.attentionBackward({ qkv: a.qkv[i], y: a.att[i], dy: a.datt, lse: a.lse[i],
          delta: a.delta, dqkv: a.dqkv, ds: a.attnDs, B, T, H, D }),
        k.rope({ qkv: a.dqkv, table: a.rope, N, T, H, D, inverse: true }),
        ...linearBackward(a.dqkv, a.n1[i], p(i, 'self_attn.q_proj'), a.dn, 3 * C, C),
        ...normBackward(a.res[i], a.rstd1[i], p(i, 'input_layernorm'), a.dres, true),  // dres = d res[i]
      );
    }
    backward.push(k.embedBackward({ buckets: a.buckets, dx: a.dres, dwte: this.t(G, wte),
      N, C, V }));

    const flat = async (list) => (await Promise.all(list)).flat();
    const plan = { B, T, N, rows, acts: a, forward: await flat(forward) };
    plan.heads = await flat(head.map((h) => h.forward));   // each chunk's lm head, for logitRows
    if (head.length === 1) {
      // One chunk: the lists as they have always been; a step runs them in order.
      const [h] = head;
      plan.forward.push(plan.heads[0]);
      plan.loss = await flat([h.loss, lossMean, ...scaled(h)]);
      plan.backward = await flat([...h.backward, ...backward]);
      return plan;
    }
    const chunkOps = await Promise.all(head.map(async (h, c) => ({
      loss: [plan.heads[c], ...await flat([h.loss, ...scaled(h)])],
      backward: await flat(h.backward),
    })));
    const [mean, rest] = await Promise.all([flat([lossMean]), flat(backward)]);
    plan.loss = [...chunkOps.flatMap((c) => c.loss), ...mean];
    plan.backward = [...chunkOps.flatMap((c) => c.backward), ...rest];
    plan.step = [...plan.forward, ...chunkOps.flatMap((c) => [...c.loss, ...c.backward]), ...mean,
      ...rest];
    return plan;
  }

  /** Upload a batch: tokens and targets, each [B, T] row-major. */
  writeBatch(plan, tokens, targets = null) {
    if (tokens.length !== plan.N) throw new Error(`expected ${plan.N} tokens, got ${tokens.length}`);
    const V = this.config.vocab_size;
    for (const arr of [tokens, targets]) {
      if (!arr) continue;
      for (let i = 0; i < arr.length; i++) {
        if (arr[i] < 0 || arr[i] >= V) throw new Error(`token ${arr[i]} at ${i} is outside [0, ${V})`);
      }
    }
    // Batches from the server are Uint32Array already: written as they are, no per-step copy.
    const u32 = (a) => (a instanceof Uint32Array ? a : Uint32Array.from(a));
    this.device.queue.writeBuffer(plan.acts.tokens, 0, u32(tokens));
    if (targets) this.device.queue.writeBuffer(plan.acts.targets, 0, u32(targets));
    // The embedding backward's buckets: a counting sort, O(N + V) on the CPU.
    plan.bucketWords ??= new Uint32Array(tokenBucketsNumel(plan.N, V));
    this.device.queue.writeBuffer(plan.acts.buckets, 0, tokenBuckets(tokens, V, plan.bucketWords));
  }

  /** Encode forward + loss + backward into `encoder` (the trainer adds the optimizer); `first`:
   *  the first compute pass's descriptor (timestampWrites), or null. A chunked plan's step
   *  interleaves loss and backward (buildOps sets it); one chunk's is the three lists in order,
   *  taken at the first step. */
  encodeStep(encoder, plan, first = null) {
    plan.step ??= [...plan.forward, ...plan.loss, ...plan.backward];
    encodeOps(encoder, plan.step, first);
  }

  /** Mean loss and all gradients for one batch (grads start from zero). */
  async lossAndGrads(tokens, targets, B, T) {
    const plan = await this.plan(B, T);
    this.writeBatch(plan, tokens, targets);
    const enc = this.device.createCommandEncoder();
    enc.clearBuffer(this.G);
    this.encodeStep(enc, plan);
    this.device.queue.submit([enc.finish()]);
    const losses = new Float32Array(await readBuffer(this.device, plan.acts.losses));
    return { loss: losses[plan.N], grads: await this.getGrads() };
  }

  /** Logits [B, T, V] for a batch of tokens (read back a loss chunk at a time). */
  async logits(tokens, B, T) {
    const plan = await this.plan(B, T);
    this.writeBatch(plan, tokens);
    this.submit(plan.forward);
    const V = this.config.vocab_size;
    const out = new Float32Array(plan.N * V);
    for (const [r0, n] of lossChunks(plan.N, plan.rows)) out.set(await this.logitRows(plan, r0, n), r0 * V);
    return out;
  }

  /** Every layer's attention probabilities for the batch whose forward was submitted last on
   *  `plan`: Float32Array [L, B, H, T, T] (layer l's head h: row i the query, column j the key,
   *  zero above the diagonal). Reads the forward's own q, k and logsumexp: the softmax it used.
   *  For short views (a prompt's text); never part of a training step. */
  async attentionProbs(plan) {
    const { n_embd: C, n_layer: L, n_head: H } = this.config;
    const { B, T } = plan;
    const per = B * H * T * T;
    const stride = Math.ceil(per / 64) * 64;   // layers' views start 256-byte aligned
    const probs = storageBuffer(this.device, L * stride * 4, { label: 'attention probs' });
    try {
      const ops = await Promise.all([...Array(L)].map((_, l) => this.k.attentionProbs({
        qkv: plan.acts.qkv[l], lse: plan.acts.lse[l], probs: view(probs, l * stride, per),
        B, T, H, D: C / H })));
      this.submit(ops);
      releaseOps(ops);
      const all = new Float32Array(await readBuffer(this.device, probs));
      const out = new Float32Array(L * per);
      for (let l = 0; l < L; l++) out.set(all.subarray(l * stride, l * stride + per), l * per);
      return out;
    } finally {
      probs.destroy();
    }
  }

  /** Logits [count, V] of rows [row0, row0 + count) of the batch whose forward was submitted
   *  last; the rows lie in one loss chunk. With one chunk the forward left every row's in
   *  acts.logits; with more, their chunk's lm head runs first. */
  async logitRows(plan, row0, count) {
    const c = Math.floor(row0 / plan.rows);
    const end = Math.min(plan.N, (c + 1) * plan.rows);
    if (count < 1 || row0 + count > end) throw new Error(`rows ${row0} + ${count} cross a loss chunk of ${plan.rows}`);
    if (plan.heads.length > 1) this.submit([plan.heads[c]]);
    const V = this.config.vocab_size;
    return new Float32Array(await readBuffer(this.device, plan.acts.logits, count * V * 4,
      (row0 - c * plan.rows) * V * 4));
  }
}

/** Frees a plan's activation buffers and its ops' uniforms. */
function destroyPlan(plan) {
  for (const buf of Object.values(plan.acts).flat()) buf.destroy();
  releaseOps([...plan.forward, ...plan.loss, ...plan.backward]);
}

/** A model from a layout, initialised from `seed` on the GPU. */
export async function createModel(ctx, layout, { seed = 0 } = {}) {
  const model = new Model(ctx, layout);
  await model.init(seed);
  return model;
}
