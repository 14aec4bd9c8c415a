"""server/optim.py: the 8-bit quantization maps equal bitsandbytes' own, and the state accounting
matches what bitsandbytes' AdamW8bit allocates (CPU only)."""

import math
import struct

import pytest

from andrea.model import PRESETS, ModelConfig, build_layout
from andrea.optim import (
    BLOCKSIZE,
    MIN_8BIT_SIZE,
    block_plan,
    create_dynamic_map,
    optimizer_memory,
    quantization_maps,
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


@pytest.mark.parametrize("preset", list(PRESETS))
def test_state_bytes(preset):
    layout = build_layout(PRESETS[preset])
    mem = optimizer_memory(layout)
    n = layout["total_numel"]
    assert mem["adamw"]["state_bytes"] == 8 * n
    assert mem["adamw_f16"]["mirror_bytes"] == 2 * n
    q8 = mem["adamw_8bit"]["state_bytes"]
    assert q8 <= 0.3 * mem["adamw"]["state_bytes"]
    # bitsandbytes: per tensor >= 4096: numel bytes per state + 4 B absmax per 256-block per state
    bnb = 0
    for p in layout["params"]:
        blocks = math.ceil(p["numel"] / BLOCKSIZE)
        bnb += 2 * p["numel"] + 8 * blocks if p["numel"] >= MIN_8BIT_SIZE else 8 * p["numel"]
    assert bnb <= q8 <= bnb * 1.01   # ours rounds each tensor's codes up to whole blocks


def test_block_plan_matches_bitsandbytes_state():
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    layout = build_layout(ModelConfig(vocab_size=515, n_embd=60, n_head=6, ffn_dim=100, n_layer=1))
    ps = [torch.nn.Parameter(torch.zeros(p["shape"])) for p in layout["params"]]
    opt = bnb.optim.AdamW8bit(ps)
    for q in ps:
        q.grad = torch.ones_like(q)
    opt.step()
    q_blocks = sum(opt.state[q]["absmax1"].numel() for q in ps
                   if opt.state[q]["state1"].dtype == torch.uint8)
    f32 = sum(q.numel() for q in ps if opt.state[q]["state1"].dtype == torch.float32)
    plan = block_plan(layout)
    assert plan["q_blocks"] == q_blocks and plan["f32_numel"] == f32


def test_layout_and_maps_routes(client):
    r = client.get("/api/presets/tiny/layout")
    assert r.status_code == 200
    st = r.json()["optimizer_state"]
    assert set(st) == {"adamw", "adamw_f16", "adamw_8bit"}
    assert st["adamw_8bit"]["state_bytes"] < 0.3 * st["adamw"]["state_bytes"]
    r = client.post("/api/layout", json={"vocab_size": 515, "seq_len": 128, "n_layer": 3})
    assert r.json()["optimizer_state"]["adamw"]["state_bytes"] == 8 * r.json()["total_numel"]
    maps = client.get("/api/optimizer/maps").json()
    assert maps == quantization_maps()
    assert len(maps["signed"]) == len(maps["unsigned"]) == 256
    assert maps["blocksize"] == 256 and maps["min_8bit_size"] == 4096
