"""The attention maps' probabilities (Model.attentionProbs, 05_attention_probs.wgsl) against
Hugging Face LlamaForCausalLM's output_attentions on the same weights and text: every layer's
and head's [T, T] softmax, within 1e-5, through each of the engine's attention paths (the row
kernels below T 128, the tiled ones from there)."""

import numpy as np
import pytest
import torch

from andrea.model import ModelConfig, build_layout
from tests import reference as ref
from tests.lab import b64, call

CONFIGS = {
    "rows": ModelConfig(vocab_size=16, n_embd=64, n_layer=2, n_head=4, ffn_dim=192, seq_len=21),
    "tiled": ModelConfig(vocab_size=512, n_embd=64, n_layer=2, n_head=2, ffn_dim=128, seq_len=150),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_attention_probabilities_match_hf_llama(lab_session, name):
    layout = build_layout(CONFIGS[name])
    cfg = layout["config"]
    L, H, T = cfg["n_layer"], cfg["n_head"], cfg["seq_len"]
    flat = ref.random_params(layout, seed=4, scale=10.0)   # far from uniform attention
    tokens = np.random.default_rng(2).integers(0, cfg["vocab_size"], (1, T))
    got = call(lab_session, """
        const model = await lab.createModel({layout: args.layout, seed: 1});
        model.setParams(args.flat);
        const plan = await model.plan(1, args.T);
        model.writeBatch(plan, args.tokens);
        model.submit(plan.forward);
        const probs = await model.attentionProbs(plan);
        model.destroy();
        return {probs};
    """, {"layout": layout, "flat": b64(flat), "tokens": b64(tokens.ravel().astype(np.int32)),
          "T": T})["probs"].reshape(L, H, T, T)
    with torch.no_grad():
        out = ref.hf_model(layout, flat)(input_ids=torch.from_numpy(tokens),
                                         output_attentions=True)
    want = np.stack([a[0].numpy() for a in out.attentions])         # [L, H, T, T]
    err = float(np.max(np.abs(got - want)))
    print(f"\n{name}: attention probabilities max abs diff {err:.2e}")
    assert err <= 1e-5
    assert np.all(np.triu(got, 1) == 0)                              # causal: none above
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
