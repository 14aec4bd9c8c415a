"""server/optim.py: the 8-bit quantization maps equal bitsandbytes' own, and the state accounting
matches what bitsandbytes' AdamW8bit allocates (CPU only)."""

import math
import struct

import pytest

from andrea.model import PRESETS, ModelConfig, build_layout
from andrea.optim import (
    BLOCKSIZE,
    DEFAULT_8BIT_POLICY,
    EMBEDDING,
    F32_POLICIES,
    MIN_8BIT_SIZE,
    block_plan,
    checkpoint_sections,
    create_dynamic_map,
    f32_tensors,
    optimizer_memory,
)


def f32_bits(xs):
    return [struct.unpack("<I", struct.pack("<f", x))[0] for x in xs]


@pytest.mark.parametrize("signed", [True, False])
def test_maps_equal_bitsandbytes(signed):
    F = pytest.importorskip("bitsandbytes.functional")
    ours = create_dynamic_map(signed)
    ref = F.create_dynamic_map(signed=signed).tolist()
    assert len(ours) == 256
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
    assert not bad, f"{len(bad)} entries differ, first {bad[:3]}"
    assert f32_bits(ours) == f32_bits(ref)


def test_map_shape():
    s, u = create_dynamic_map(True), create_dynamic_map(False)
    assert s == sorted(s) and u == sorted(u)
    assert s[-1] == 1.0 and s.count(0.0) == 1 and min(s) > -1
    assert u[0] == 0.0 and u[-1] == 1.0 and min(u) >= 0
    assert all(x == struct.unpack("<f", struct.pack("<f", x))[0] for x in s + u)   # exact f32


@pytest.mark.parametrize("policy", list(F32_POLICIES))
@pytest.mark.parametrize("preset", list(PRESETS))
def test_state_bytes(preset, policy):
    layout = build_layout(PRESETS[preset])
    mem = optimizer_memory(layout, policy)
    n = layout["total_numel"]
    assert mem["adamw"]["state_bytes"] == 8 * n
    assert mem["adamw_f16"]["mirror_bytes"] == 2 * n
    q8 = mem["adamw_8bit"]["state_bytes"]
    if policy == "all":
        assert q8 <= 0.3 * mem["adamw"]["state_bytes"]
    else:     # the embedding's f32 state: 8 B per element of it
        emb = next(p["numel"] for p in layout["params"] if p["name"] == EMBEDDING)
        assert q8 <= 0.3 * mem["adamw"]["state_bytes"] + 8 * emb
    # bitsandbytes: per tensor >= 4096: numel bytes per state + 4 B absmax per 256-block per state;
    # a tensor overridden to 32-bit (GlobalOptimManager) and the small ones: 8 B per element.
    keep = F32_POLICIES[policy]
    bnb = 0
    for p in layout["params"]:
        blocks = math.ceil(p["numel"] / BLOCKSIZE)
        is8 = p["numel"] >= MIN_8BIT_SIZE and p["name"] not in keep
        bnb += 2 * p["numel"] + 8 * blocks if is8 else 8 * p["numel"]
    assert bnb <= q8 <= bnb * 1.01   # ours rounds each tensor's codes up to whole blocks
    assert mem["adamw_8bit"]["f32_tensors"] == f32_tensors(layout, policy)
    assert [s["bytes"] for s in checkpoint_sections(layout, "adamw_8bit", "fp32", policy)] == [
        4 * n, 2 * BLOCKSIZE * mem["adamw_8bit"]["q_blocks"],
        q8 - 2 * BLOCKSIZE * mem["adamw_8bit"]["q_blocks"]]


def test_f32_tensors_are_the_servers_choice():
    layout = build_layout(PRESETS["12m"])
    small = [p["name"] for p in layout["params"] if p["numel"] < MIN_8BIT_SIZE]
    assert small and all(n.endswith("norm.weight") for n in small)
    assert f32_tensors(layout, "all") == small
    assert f32_tensors(layout, "embed_f32") == [EMBEDDING, *small]     # layout order
    assert DEFAULT_8BIT_POLICY == "embed_f32"                          # bench_fidelity.mjs
    assert optimizer_memory(layout)["adamw_8bit"]["policy"] == DEFAULT_8BIT_POLICY
    with pytest.raises(ValueError, match="unknown 8-bit policy"):
        f32_tensors(layout, "nope")


def test_block_plan_matches_bitsandbytes_state():
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    layout = build_layout(ModelConfig(vocab_size=515, n_embd=60, n_head=6, ffn_dim=100, n_layer=1))
    for policy in F32_POLICIES:
        ps = [torch.nn.Parameter(torch.zeros(p["shape"])) for p in layout["params"]]
        # bitsandbytes' way to keep a tensor's state in 32-bit (what StableEmbedding does).
        manager = bnb.optim.GlobalOptimManager.get_instance()
        manager.initialize()
        for q, p in zip(ps, layout["params"]):
            if p["name"] in F32_POLICIES[policy]:
                manager.override_config(q, "optim_bits", 32)
        opt = bnb.optim.AdamW8bit(ps)
        for q in ps:
            q.grad = torch.ones_like(q)
        opt.step()
        q_blocks = sum(opt.state[q]["absmax1"].numel() for q in ps
                       if opt.state[q]["state1"].dtype == torch.uint8)
        f32 = sum(q.numel() for q in ps if opt.state[q]["state1"].dtype == torch.float32)
        plan = block_plan(layout, policy)
        assert plan["q_blocks"] == q_blocks and plan["f32_numel"] == f32, policy
        assert set(plan["f32_tensors"]) == {p["name"] for q, p in zip(ps, layout["params"])
                                            if opt.state[q]["state1"].dtype == torch.float32}
