"""The loss over chunks of rows (model.js lossChunkRows; Model's lossRows forces them on a small
model): against the same model with one chunk, the per-row losses, the mean, the logit stats and
the logits are the same bits, every gradient but the tied embedding's the same bits, and the
embedding's equal up to its sum's order; against Hugging Face LlamaForCausalLM, loss, logits and
gradients as test_model_parity.py holds them. Also the eval's forward + loss (G untouched), the
loss scale's dlogits, and samples whose last position falls in either chunk."""

import numpy as np
import pytest

from andrea.model import PRESETS, ModelConfig, build_layout
from tests import reference as ref
from tests.lab import b64, call

# name: (config, B, rows per chunk): tiny's 128 rows in two equal chunks (its vocabulary of 512
# takes cross_entropy_direct on a software adapter); an odd vocabulary over 1024 (a workgroup a
# row everywhere: kernels.js lossThreads) and 256 rows in chunks of 192 and 64.
CASES = {
    "tiny": (PRESETS["tiny"], 2, 64),
    "odd": (ModelConfig(vocab_size=1027, n_embd=64, n_layer=2, n_head=4, ffn_dim=192,
                        seq_len=128), 2, 192),
}

# The JS both models share: one chunk (lossChunkRows: tiny binds) and `rows` a chunk.
MODELS = """
    const {Model} = await import('/static/js/engine/model.js');
    const {readBuffer} = await import('/static/js/engine/gpu.js');
    const make = async (lossRows) => {
      const m = new Model(lab.ctx, args.layout, {lossRows});
      await m.init(1);
      m.setParams(args.flat);
      return m;
    };
"""


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def problem(name):
    config, B, rows = CASES[name]
    layout = build_layout(config)
    T = layout["config"]["seq_len"]
    V = layout["config"]["vocab_size"]
    rng = np.random.default_rng(11)
    flat = ref.random_params(layout, seed=5, scale=10.0)   # far from uniform attention
    tokens = rng.integers(0, V, (B, T))
    targets = rng.integers(0, V, (B, T))
    return layout, flat, tokens, targets, rows


@pytest.mark.parametrize("name", list(CASES))
def test_chunked_loss_matches_one_chunk_and_hf_llama(lab_session, name):
    layout, flat, tokens, targets, rows = problem(name)
    B, T = tokens.shape
    out = call(lab_session, MODELS + """
        const run = async (lossRows) => {
          const m = await make(lossRows);
          const plan = await m.plan(args.B, args.T);
          const logits = await m.logits(args.tokens, args.B, args.T);
          const {loss, grads} = await m.lossAndGrads(args.tokens, args.targets, args.B, args.T);
          const losses = new Float32Array(await readBuffer(lab.ctx.device, plan.acts.losses));
          // The trainer's eval: forward + loss only, on a G cleared to zero.
          const {encodeOps} = await import('/static/js/engine/ops.js');
          const enc = lab.ctx.device.createCommandEncoder();
          enc.clearBuffer(m.G);
          encodeOps(enc, [...plan.forward, ...plan.loss]);
          lab.ctx.device.queue.submit([enc.finish()]);
          const evalLosses = new Float32Array(await readBuffer(lab.ctx.device, plan.acts.losses));
          const evalGrads = await m.getGrads();
          const chunks = plan.heads.length;
          const logitsBytes = plan.acts.logits.size;
          m.destroy();
          return {logits, loss, grads, losses, evalLosses, evalGrads, chunks, logitsBytes};
        };
        return {one: await run(null), chunked: await run(args.rows)};
    """, {"layout": layout, "flat": b64(flat), "tokens": b64(tokens.ravel().astype(np.int32)),
          "targets": b64(targets.ravel().astype(np.int32)), "B": B, "T": T, "rows": rows})
    one, chunked = out["one"], out["chunked"]
    N, V = B * T, layout["config"]["vocab_size"]
    assert one["chunks"] == 1 and chunked["chunks"] == -(-N // rows) > 1
    assert chunked["logitsBytes"] == rows * V * 4 < one["logitsBytes"] == N * V * 4

    # (a) Bit for bit: per-row losses, the mean, the logit stats, and the logits.
    np.testing.assert_array_equal(bits(chunked["losses"]), bits(one["losses"]))
    assert np.float32(chunked["loss"]).view(np.uint32) == np.float32(one["loss"]).view(np.uint32)
    np.testing.assert_array_equal(bits(chunked["logits"]), bits(one["logits"]))
    # The eval's forward + loss: the same losses, and G left at zero.
    np.testing.assert_array_equal(bits(chunked["evalLosses"]), bits(one["losses"]))
    assert not np.any(chunked["evalGrads"]) and not np.any(one["evalGrads"])

    # (b) Gradients: each row's dn is the same bits, so every gradient but the tied embedding's;
    # the embedding's sums the chunks' lm-head gradients in another order.
    wte = next(p for p in layout["params"] if p["name"] == "model.embed_tokens.weight")
    for p in layout["params"]:
        s = slice(p["offset"], p["offset"] + p["numel"])
        if p is wte:
            g1, gc = one["grads"][s], chunked["grads"][s]
            err = float(np.max(np.abs(gc - g1)))
            assert err <= 1e-6 * float(np.max(np.abs(g1))), f"wte: chunked vs one chunk {err:.3e}"
        else:
            np.testing.assert_array_equal(bits(chunked["grads"][s]), bits(one["grads"][s]),
                                          err_msg=p["name"])

    # (c) Against PyTorch, as test_model_parity.py.
    loss, grads, logits = ref.loss_and_grads(layout, flat, tokens, targets)
    assert abs(chunked["loss"] - loss) <= 1e-5 * abs(loss), (chunked["loss"], loss)
    assert np.max(np.abs(chunked["logits"] - logits.ravel())) <= 1e-5 * np.max(np.abs(logits))
    for p in layout["params"]:
        s = slice(p["offset"], p["offset"] + p["numel"])
        err = float(np.max(np.abs(chunked["grads"][s] - grads[s])))
        scale = float(np.max(np.abs(grads[s])))
        assert err <= 1e-4 * scale, f"{p['name']}: max abs diff {err:.3e} > 1e-4 x {scale:.3e}"


def test_chunked_loss_scale_scales_each_chunks_dlogits(lab_session):
    """With a loss scaler (mixed precision's, here on fp32 kernels) every chunk's dlogits are
    scaled: the gradients are the scale (a power of two, so exactly) times the unscaled ones."""
    layout, flat, tokens, targets, rows = problem("tiny")
    B, T = tokens.shape
    scale = 1024.0
    out = call(lab_session, MODELS + """
        const {storageBuffer} = await import('/static/js/engine/gpu.js');
        const scaler = storageBuffer(lab.ctx.device, 16, {label: 'scaler',
          data: new Float32Array([args.scale, 0, 0, 0])});
        const run = async (lossRows, scaled) => {
          const m = new Model(lab.ctx, args.layout, {lossRows});
          if (scaled) m.useOptimizer({scaler});
          await m.init(1);
          m.setParams(args.flat);
          const r = await m.lossAndGrads(args.tokens, args.targets, args.B, args.T);
          m.destroy();
          return r;
        };
        const out = {plain: await run(args.rows, false), one: await run(null, true),
                     chunked: await run(args.rows, true)};
        scaler.destroy();
        return out;
    """, {"layout": layout, "flat": b64(flat), "tokens": b64(tokens.ravel().astype(np.int32)),
          "targets": b64(targets.ravel().astype(np.int32)), "B": B, "T": T, "rows": rows,
          "scale": scale})
    plain, one, chunked = out["plain"], out["one"], out["chunked"]
    assert chunked["loss"] == one["loss"] == plain["loss"]
    np.testing.assert_array_equal(bits(chunked["grads"]), bits(plain["grads"] * np.float32(scale)))
    err = np.max(np.abs(chunked["grads"] - one["grads"]))
    assert err <= 1e-6 * np.max(np.abs(one["grads"]))


def test_chunked_plan_samples_the_ids_of_one_chunk(lab_session):
    """The sampler reads the last position's logits: from either chunk of a chunked plan, the same
    ids as with one chunk (prompt 60 + 10 new: positions 59..68 cross the chunk edge at 64)."""
    layout, flat, _, _, _ = problem("odd")
    out = call(lab_session, MODELS + """
        const {generate} = await import('/static/js/engine/sampler.js');
        const prompt = Array.from({length: 60}, (_, i) => (i * 37 + 5) % 1027);
        const run = async (lossRows) => {
          const m = await make(lossRows);
          const plan = await m.plan(1, 128);
          const ids = await generate(m, prompt, 10, {seed: 4, window: 128});
          const greedy = await generate(m, prompt, 10, {temperature: 0, window: 128});
          const chunks = plan.heads.length;
          m.destroy();
          return {ids, greedy, chunks};
        };
        return {one: await run(null), chunked: await run(64)};
    """, {"layout": layout, "flat": b64(flat)})
    assert out["one"]["chunks"] == 1 and out["chunked"]["chunks"] == 2
    assert out["chunked"]["ids"] == out["one"]["ids"]
    assert out["chunked"]["greedy"] == out["one"]["greedy"]
    assert len(set(out["one"]["greedy"])) > 1
