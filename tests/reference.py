"""PyTorch references: Hugging Face LlamaForCausalLM built from THE parameter table, and plain
torch functions for each kernel. Shapes come from the layout; nothing is restated here."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from andrea import export


def hf_config(config: dict, attention: str = "eager") -> LlamaConfig:
    """The exported config.json's mapping (andrea.export.hf_config), so the parity tests check
    it too; eager attention, as the per-kernel references compute it (bench_step_torch.py also
    times HF's default, "sdpa")."""
    return LlamaConfig.from_dict(export.hf_config(config), attn_implementation=attention)


def hf_model(layout: dict, flat: np.ndarray) -> LlamaForCausalLM:
    """LlamaForCausalLM whose weights are read from the flat W buffer by table offsets."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_config(layout["config"])).float()
    state = {p["name"]: torch.from_numpy(
        flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"]).copy())
        for p in layout["params"]}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head.weight is tied to embed_tokens; rotary inv_freq is a buffer.
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def flat_grads(model: LlamaForCausalLM, layout: dict) -> np.ndarray:
    """Gradients in the W layout (the same offsets as the engine's G buffer)."""
    out = np.zeros(layout["total_numel"], dtype=np.float32)
    named = dict(model.named_parameters())
    for p in layout["params"]:
        out[p["offset"]:p["offset"] + p["numel"]] = named[p["name"]].grad.numpy().ravel()
    return out


def loss_and_grads(layout: dict, flat: np.ndarray, tokens: np.ndarray, targets: np.ndarray):
    """Mean token cross-entropy and the flat gradient, as the engine's lossAndGrads gives them."""
    model = hf_model(layout, flat)
    logits = model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.from_numpy(targets.astype(np.int64)).ravel())
    loss.backward()
    return float(loss.detach()), flat_grads(model, layout), logits.detach().numpy()


def random_params(layout: dict, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Random W with the table's init std (times `scale`) and gains near one."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(layout["total_numel"], dtype=np.float32)
    for p in layout["params"]:
        if p["init"] == "ones":
            v = 1.0 + 0.1 * rng.standard_normal(p["numel"])
        else:
            v = p["init_std"] * scale * rng.standard_normal(p["numel"])
        flat[p["offset"]:p["offset"] + p["numel"]] = v
    return flat


# ---- per-kernel references (torch float32, CPU) -----------------------------------------

def rmsnorm(x, g, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return g * (x * torch.rsqrt(var + eps))


def rope(qkv, B, T, H, D, theta):
    """HF apply_rotary_pos_emb on the q and k thirds of qkv [B*T, 3C]."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    C = H * D
    x = qkv.reshape(B, T, 3, H, D)
    q = x[:, :, 0].transpose(1, 2)
    k = x[:, :, 1].transpose(1, 2)
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    q2, k2 = apply_rotary_pos_emb(q, k, emb.cos()[None], emb.sin()[None])
    out = torch.stack([q2.transpose(1, 2), k2.transpose(1, 2), x[:, :, 2]], dim=2)
    return out.reshape(B * T, 3 * C)


def attention(qkv, B, T, H, D):
    """Causal softmax attention of qkv [B*T, 3C] -> y [B*T, C]."""
    x = qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)   # [3, B, H, T, D]
    q, k, v = x[0], x[1], x[2]
    s = q @ k.transpose(-1, -2) / D ** 0.5
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    s = s.masked_fill(mask, float("-inf"))
    y = torch.softmax(s, -1) @ v                              # [B, H, T, D]
    lse = torch.logsumexp(s, -1)                              # [B, H, T]
    return y.transpose(1, 2).reshape(B * T, H * D), lse


def swiglu(gu, F):
    g, u = gu[:, :F], gu[:, F:]
    return torch.nn.functional.silu(g) * u
