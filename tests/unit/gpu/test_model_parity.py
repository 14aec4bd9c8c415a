"""The whole model against Hugging Face LlamaForCausalLM (CPU, fp32), same weights and batch:
loss (relative diff <= 1e-5), logits, and every parameter's gradient
(max abs diff <= 1e-4 x max |grad| of that tensor; failures name the tensor)."""

import numpy as np
import pytest

from andrea.model import PRESETS, ModelConfig, build_layout
from andrea.run_config import RunConfig, run_model
from tests import reference as ref
from tests.lab import b64, call

CONFIGS = {
    "tiny": PRESETS["tiny"],
    # Longer context, three layers, an odd vocabulary: nothing lines up with tile sizes.
    "odd": ModelConfig(vocab_size=515, n_embd=64, n_layer=3, n_head=4, ffn_dim=192, seq_len=128),
    # A run's own shape, through the path a run takes (RunConfig -> run_model): head dim 24,
    # an FFN width and context off every tile size, a vocabulary of its own.
    "run-shape": run_model(RunConfig(preset="tiny", n_layer=3, n_embd=72, n_head=3, ffn_dim=136,
                                     vocab_size=1024, seq_len=80)),
}


def engine_step(page, layout, flat, tokens, targets):
    B, T = tokens.shape
    return call(page, """
        const model = await lab.createModel({layout: args.layout, seed: 1});
        model.setParams(args.flat);
        const logits = await model.logits(args.tokens, args.B, args.T);
        const {loss, grads} = await model.lossAndGrads(args.tokens, args.targets, args.B, args.T);
        model.destroy();
        return {loss, grads, logits};
    """, {"layout": layout, "flat": b64(flat), "tokens": b64(tokens.ravel().astype(np.int32)),
          "targets": b64(targets.ravel().astype(np.int32)), "B": B, "T": T})


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loss_logits_and_grads_match_hf_llama(lab_session, name):
    layout = build_layout(CONFIGS[name])
    cfg = layout["config"]
    rng = np.random.default_rng(7)
    B, T = 2, cfg["seq_len"]
    # Weights 10x the init std so attention is far from uniform and every path matters.
    flat = ref.random_params(layout, seed=3, scale=10.0)
    tokens = rng.integers(0, cfg["vocab_size"], (B, T))
    targets = rng.integers(0, cfg["vocab_size"], (B, T))
    out = engine_step(lab_session, layout, flat, tokens, targets)
    loss, grads, logits = ref.loss_and_grads(layout, flat, tokens, targets)

    rel = abs(out["loss"] - loss) / abs(loss)
    print(f"\n{name}: loss engine {out['loss']:.7f} torch {loss:.7f} rel {rel:.2e}")
    assert rel <= 1e-5, f"loss {out['loss']} vs {loss}"
    lerr = np.max(np.abs(out["logits"] - logits.ravel())) / np.max(np.abs(logits))
    print(f"{name}: logits max rel err {lerr:.2e}")
    assert lerr <= 1e-5
    worst = []
    for p in layout["params"]:
        s = slice(p["offset"], p["offset"] + p["numel"])
        g_ref, g_eng = grads[s], out["grads"][s]
        err = float(np.max(np.abs(g_eng - g_ref)))
        scale = float(np.max(np.abs(g_ref)))
        worst.append((err / scale, p["name"]))
        assert err <= 1e-4 * scale, f"{p['name']}: max abs diff {err:.3e} > 1e-4 x {scale:.3e}"
    print(f"{name}: worst grad rel err {max(worst)[0]:.2e} ({max(worst)[1]})")
    # Padding between tensors carries no gradient.
    mask = np.ones(layout["total_numel"], bool)
    for p in layout["params"]:
        mask[p["offset"]:p["offset"] + p["numel"]] = False
    assert not np.any(out["grads"][mask])


def test_gpu_init_matches_table(lab_session):
    """Seeded GPU init: std per tensor as the table says, gains one, same seed same weights."""
    layout = build_layout(PRESETS["tiny"])
    out = call(lab_session, """
        const a = await lab.createModel({layout: args.layout, seed: 5});
        const b = await lab.createModel({layout: args.layout, seed: 5});
        const c = await lab.createModel({layout: args.layout, seed: 6});
        const out = {a: await a.getParams(), b: await b.getParams(), c: await c.getParams()};
        for (const m of [a, b, c]) m.destroy();
        return out;
    """, {"layout": layout})
    np.testing.assert_array_equal(out["a"], out["b"])
    assert not np.array_equal(out["a"], out["c"])
    for p in layout["params"]:
        w = out["a"][p["offset"]:p["offset"] + p["numel"]]
        if p["init"] == "ones":
            assert np.all(w == 1.0), p["name"]
        else:
            assert abs(w.mean()) < 4 * p["init_std"] / np.sqrt(p["numel"]) + 1e-7, p["name"]
            assert abs(w.std() / p["init_std"] - 1) < 0.05, (p["name"], w.std())


def test_f16_mirror_forward_matches_f16_rounded_matmul_weights(lab_session):
    """With the mirror on, every matmul reads f16 weights (embedding lookup and norm gains stay
    f32): logits equal HF Llama's with its linear weights rounded to f16."""
    import torch

    layout = build_layout(PRESETS["tiny"])
    flat = ref.random_params(layout, seed=4, scale=10.0)
    rng = np.random.default_rng(8)
    tokens = rng.integers(0, 512, (2, 64))
    out = call(lab_session, """
        const {packHalf2} = await import('/static/js/engine/optimizer_tables.js');
        const model = await lab.createModel({layout: args.layout, seed: 1});
        model.setParams(args.flat);
        const mirror = lab.ctx.device.createBuffer({size: args.flat.length * 2,
            usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
        lab.ctx.device.queue.writeBuffer(mirror, 0, packHalf2(args.flat));
        model.useOptimizer({mirror});
        const logits = await model.logits(args.tokens, 2, 64);
        model.destroy();
        mirror.destroy();
        return {logits};
    """, {"layout": layout, "flat": b64(flat), "tokens": b64(tokens.ravel().astype(np.int32))})
    model = ref.hf_model(layout, flat)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed_tokens" not in name:
                p.copy_(p.half().float())
        hidden = model.model(input_ids=torch.from_numpy(tokens)).last_hidden_state
        wte16 = model.model.embed_tokens.weight.half().float()
        logits = (hidden @ wte16.T).numpy().ravel()
    err = np.max(np.abs(out["logits"] - logits)) / np.max(np.abs(logits))
    print(f"\nf16 mirror: logits max rel err {err:.2e}")
    assert err <= 1e-5
