// The Llama model on the GPU: weights W and grads G in two mega-buffers laid out by the
// parameter table (server/model.py, received as `layout`, never re-derived here), and per
// (B, T) a plan: activation buffers plus the forward and backward op lists, built once.
//
// Legend: B batch, T time, C channels, L layers, H heads, D = C / H, F FFN width, V vocab,
// N = B * T rows.

import { readBuffer, storageBuffer } from './gpu.js';
import { Kernels, ropeTable } from './kernels.js';
import { copyOp, encodeOps, view } from './ops.js';

export class Model {
  /** ctx: {device, lib} from the lab or trainer; layout: the server's parameter table. */
  constructor(ctx, layout) {
    this.ctx = ctx;
    this.device = ctx.device;
    this.layout = layout;
    this.config = layout.config;
    this.params = Object.fromEntries(layout.params.map((p) => [p.name, p]));
    this.k = new Kernels(ctx.device, ctx.lib);
    const bytes = layout.total_numel * 4;
    const limit = Math.min(ctx.limits.maxStorageBufferBindingSize, ctx.limits.maxBufferSize);
    if (bytes > limit) {
      throw new Error(`the weights need ${bytes} bytes in one buffer; this adapter allows ${limit}`);
    }
    this.W = storageBuffer(this.device, bytes, { label: 'W' });   // weights
    this.G = storageBuffer(this.device, bytes, { label: 'G' });   // gradients (+=, zeroed by AdamW)
    this.weightsF16 = null;  // set by the optimizer when the f16 mirror is on
    this.plans = new Map();
  }

  /** Sub-range of `buffer` (W or G) holding tensor `name`, or `count` group members from it. */
  t(buffer, name, count = 1) {
    const p = this.params[name];
    if (!p) throw new Error(`no tensor ${name} in the layout`);
    return view(buffer, p.offset, p.numel * count);
  }

  /** Initialise W on the GPU from `seed`: normal(0, init_std) matrices, ones for norm gains. */
  async init(seed = 0) {
    const ops = await Promise.all(this.layout.params.map((p, stream) => this.k.init({
      w: view(this.W, p.offset, p.numel), numel: p.numel, seed, stream,
      mode: p.init === 'ones' ? 1 : 0, std: p.init_std,
    })));
    this.submit(ops);
    this.device.queue.writeBuffer(this.G, 0, new Float32Array(this.layout.total_numel));
  }

  submit(ops) {
    const enc = this.device.createCommandEncoder();
    encodeOps(enc, ops);
    this.device.queue.submit([enc.finish()]);
  }

  async getParams() { return new Float32Array(await readBuffer(this.device, this.W)); }
  async getGrads() { return new Float32Array(await readBuffer(this.device, this.G)); }

  setParams(values) {
    if (values.length !== this.layout.total_numel) {
      throw new Error(`setParams wants ${this.layout.total_numel} floats, got ${values.length}`);
    }
    this.device.queue.writeBuffer(this.W, 0, values);
  }

  zeroGrads() {
    const enc = this.device.createCommandEncoder();
    enc.clearBuffer(this.G);
    this.device.queue.submit([enc.finish()]);
  }

  /** Activations and op lists for batch shape (B, T); cached. */
  async plan(B, T) {
    const key = `${B}x${T}`;
    if (!this.plans.has(key)) this.plans.set(key, this.buildPlan(B, T));
    return this.plans.get(key);
  }

  async buildPlan(B, T) {
    const { n_embd: C, n_layer: L, n_head: H, ffn_dim: F, vocab_size: V, seq_len: Tmax,
      norm_eps: eps, rope_theta: theta } = this.config;
    if (T > Tmax) throw new Error(`sequence length ${T} exceeds the model's ${Tmax}`);
    const D = C / H;
    const N = B * T;
    const dev = this.device;
    const buf = (numel, label) => storageBuffer(dev, numel * 4, { label });
    const a = {  // activations kept for backward
      tokens: buf(N, 'tokens'), targets: buf(N, 'targets'),
      res: [...Array(L + 1)].map((_, l) => buf(N * C, `res${l}`)),     // [N, C] layer inputs
      resMid: [...Array(L)].map((_, l) => buf(N * C, `resMid${l}`)),  // [N, C] after attention
      n1: [...Array(L)].map(() => buf(N * C, 'n1')), rstd1: [...Array(L)].map(() => buf(N, 'rstd1')),
      n2: [...Array(L)].map(() => buf(N * C, 'n2')), rstd2: [...Array(L)].map(() => buf(N, 'rstd2')),
      qkv: [...Array(L)].map(() => buf(N * 3 * C, 'qkv')),             // [N, 3C] q,k roped
      att: [...Array(L)].map(() => buf(N * C, 'att')),                 // [N, C] attention out
      lse: [...Array(L)].map(() => buf(B * H * T, 'lse')),             // [B, H, T]
      gu: [...Array(L)].map(() => buf(N * 2 * F, 'gu')),               // [N, 2F] gate|up
      h: [...Array(L)].map(() => buf(N * F, 'h')),                     // [N, F]
      nf: buf(N * C, 'nf'), rstdf: buf(N, 'rstdf'),
      logits: buf(N * V, 'logits'),                                    // [N, V], then dlogits
      losses: buf(N + 1, 'losses'),                                    // [N] rows + mean
      rope: storageBuffer(dev, T * D * 4, { label: 'rope', data: ropeTable(T, D, theta) }),
      // backward scratch, reused by every layer
      dres: buf(N * C, 'dres'), dn: buf(N * C, 'dn'), datt: buf(N * C, 'datt'),
      dqkv: buf(N * 3 * C, 'dqkv'), delta: buf(B * H * T, 'delta'),
      dh: buf(N * F, 'dh'), dgu: buf(N * 2 * F, 'dgu'),
    };
    const k = this.k;
    const W = this.W;
    const G = this.G;
    const p = (i, s) => `model.layers.${i}.${s}.weight`;
    const wte = 'model.embed_tokens.weight';
    const f16 = Boolean(this.weightsF16);
    const Wm = this.weightsF16 ?? W;  // matmuls read weights from the f16 mirror when it is on

    const forward = [
      k.embed({ tokens: a.tokens, wte: this.t(W, wte), x: a.res[0], N, C }),
    ];
    for (let i = 0; i < L; i++) {
      forward.push(
        k.rmsnorm({ x: a.res[i], g: this.t(W, p(i, 'input_layernorm')), y: a.n1[i],
          rstd: a.rstd1[i], N, C, eps }),
        k.linear({ x: a.n1[i], w: this.t(Wm, p(i, 'self_attn.q_proj'), 3), y: a.qkv[i],
          M: N, N: 3 * C, K: C, wF16: f16 }),                                // [N, 3C]
        k.rope({ qkv: a.qkv[i], table: a.rope, N, T, H, D }),
        k.attention({ qkv: a.qkv[i], y: a.att[i], lse: a.lse[i], B, T, H, D }),
        copyOp(a.res[i], a.resMid[i], N * C, 'fork residual'),
        k.linear({ x: a.att[i], w: this.t(Wm, p(i, 'self_attn.o_proj')), y: a.resMid[i],
          M: N, N: C, K: C, accum: true, wF16: f16 }),                      // resMid += o(att)
        k.rmsnorm({ x: a.resMid[i], g: this.t(W, p(i, 'post_attention_layernorm')), y: a.n2[i],
          rstd: a.rstd2[i], N, C, eps }),
        k.linear({ x: a.n2[i], w: this.t(Wm, p(i, 'mlp.gate_proj'), 2), y: a.gu[i],
          M: N, N: 2 * F, K: C, wF16: f16 }),                                // [N, 2F]
        k.swiglu({ gu: a.gu[i], h: a.h[i], N, F }),
        copyOp(a.resMid[i], a.res[i + 1], N * C, 'fork residual'),
        k.linear({ x: a.h[i], w: this.t(Wm, p(i, 'mlp.down_proj')), y: a.res[i + 1],
          M: N, N: C, K: F, accum: true, wF16: f16 }),                      // res += down(h)
      );
    }
    forward.push(
      k.rmsnorm({ x: a.res[L], g: this.t(W, 'model.norm.weight'), y: a.nf, rstd: a.rstdf,
        N, C, eps }),
      k.linear({ x: a.nf, w: this.t(Wm, wte), y: a.logits, M: N, N: V, K: C, wF16: f16 }),
    );
    // Loss and dlogits (in place over logits), as its own list so logits() can skip it.
    const loss = [k.crossEntropy({ logits: a.logits, targets: a.targets, losses: a.losses,
      N, V })];

    // Backward: the forward list in exact reverse, gradients into G (+=).
    const backward = [
      k.linearBackwardInput({ dy: a.logits, w: this.t(Wm, wte), dx: a.dn, M: N, N: V, K: C,
        wF16: f16 }),
      k.linearBackwardWeight({ dy: a.logits, x: a.nf, dw: this.t(G, wte), M: N, N: V, K: C }),
      k.rmsnormBackwardGain({ dy: a.dn, x: a.res[L], rstd: a.rstdf,
        dg: this.t(G, 'model.norm.weight'), N, C }),
      k.rmsnormBackward({ dy: a.dn, x: a.res[L], g: this.t(W, 'model.norm.weight'),
        rstd: a.rstdf, dx: a.dres, N, C, accum: false }),
    ];
    for (let i = L - 1; i >= 0; i--) {
      const g1 = p(i, 'input_layernorm');
      const g2 = p(i, 'post_attention_layernorm');
      backward.push(
        // res[i+1] = resMid + down(h): dres flows to resMid unchanged, and into down.
        k.linearBackwardInput({ dy: a.dres, w: this.t(Wm, p(i, 'mlp.down_proj')), dx: a.dh,
          M: N, N: C, K: F, wF16: f16 }),
        k.linearBackwardWeight({ dy: a.dres, x: a.h[i], dw: this.t(G, p(i, 'mlp.down_proj')),
          M: N, N: C, K: F }),
        k.swigluBackward({ gu: a.gu[i], dh: a.dh, dgu: a.dgu, N, F }),
        k.linearBackwardInput({ dy: a.dgu, w: this.t(Wm, p(i, 'mlp.gate_proj'), 2), dx: a.dn,
          M: N, N: 2 * F, K: C, wF16: f16 }),
        k.linearBackwardWeight({ dy: a.dgu, x: a.n2[i], dw: this.t(G, p(i, 'mlp.gate_proj'), 2),
          M: N, N: 2 * F, K: C }),
        k.rmsnormBackwardGain({ dy: a.dn, x: a.resMid[i], rstd: a.rstd2[i],
          dg: this.t(G, g2), N, C }),
        k.rmsnormBackward({ dy: a.dn, x: a.resMid[i], g: this.t(W, g2), rstd: a.rstd2[i],
          dx: a.dres, N, C, accum: true }),                                  // dres = d resMid
        k.linearBackwardInput({ dy: a.dres, w: this.t(Wm, p(i, 'self_attn.o_proj')), dx: a.datt,
          M: N, N: C, K: C, wF16: f16 }),
        k.linearBackwardWeight({ dy: a.dres, x: a.att[i], dw: this.t(G, p(i, 'self_attn.o_proj')),
          M: N, N: C, K: C }),
        k.attentionBackward({ qkv: a.qkv[i], y: a.att[i], dy: a.datt, lse: a.lse[i],
          delta: a.delta, dqkv: a.dqkv, B, T, H, D }),
        k.rope({ qkv: a.dqkv, table: a.rope, N, T, H, D, inverse: true }),
        k.linearBackwardInput({ dy: a.dqkv, w: this.t(Wm, p(i, 'self_attn.q_proj'), 3), dx: a.dn,
          M: N, N: 3 * C, K: C, wF16: f16 }),
        k.linearBackwardWeight({ dy: a.dqkv, x: a.n1[i], dw: this.t(G, p(i, 'self_attn.q_proj'), 3),
          M: N, N: 3 * C, K: C }),
        k.rmsnormBackwardGain({ dy: a.dn, x: a.res[i], rstd: a.rstd1[i],
          dg: this.t(G, g1), N, C }),
        k.rmsnormBackward({ dy: a.dn, x: a.res[i], g: this.t(W, g1), rstd: a.rstd1[i],
          dx: a.dres, N, C, accum: true }),                                  // dres = d res[i]
      );
    }
    backward.push(k.embedBackward({ tokens: a.tokens, dx: a.dres, dwte: this.t(G, wte),
      N, C, V }));

    const flat = async (list) => (await Promise.all(list)).flat();
    return { B, T, N, acts: a, forward: await flat(forward), loss: await flat(loss),
      backward: await flat(backward) };
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
    this.device.queue.writeBuffer(plan.acts.tokens, 0, Uint32Array.from(tokens));
    if (targets) this.device.queue.writeBuffer(plan.acts.targets, 0, Uint32Array.from(targets));
  }

  /** Encode forward + loss + backward into `encoder` (the trainer adds the optimizer). */
  encodeStep(encoder, plan) {
    encodeOps(encoder, [...plan.forward, ...plan.loss, ...plan.backward]);
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

  /** Logits [B, T, V] for a batch of tokens. */
  async logits(tokens, B, T) {
    const plan = await this.plan(B, T);
    this.writeBatch(plan, tokens);
    this.submit(plan.forward);
    return new Float32Array(await readBuffer(this.device, plan.acts.logits));
  }
}

/** A model from a layout, initialised from `seed` on the GPU. */
export async function createModel(ctx, layout, { seed = 0 } = {}) {
  const model = new Model(ctx, layout);
  await model.init(seed);
  return model;
}
