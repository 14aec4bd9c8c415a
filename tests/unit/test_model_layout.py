import math
import re
from pathlib import Path

import pytest

from andrea.model import (
    ALIGN_ELEMS,
    MAX_HEAD_DIM,
    PRESETS,
    ModelConfig,
    build_layout,
    param_by_name,
)

SHADERS = Path(__file__).resolve().parents[2] / "shaders"


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_tables_add_up(name):
    cfg = PRESETS[name]
    layout = build_layout(cfg)
    C, F, V, L = cfg.n_embd, cfg.ffn_dim, cfg.vocab_size, cfg.n_layer
    expected = V * C + L * (4 * C * C + 3 * C * F + 2 * C) + C
    assert layout["n_params"] == expected
    params = param_by_name(layout)
    assert params["model.layers.0.mlp.down_proj.weight"]["shape"] == [C, F]  # [out, in]
    assert params["model.layers.0.mlp.gate_proj.weight"]["shape"] == [F, C]


def test_groups_back_to_back_and_decay_first():
    layout = build_layout(ModelConfig(vocab_size=515, n_embd=60, n_head=6, ffn_dim=100,
                                      n_layer=3, seq_len=128))
    p = param_by_name(layout)
    for i in range(3):
        q, k, v = (p[f"model.layers.{i}.self_attn.{x}_proj.weight"] for x in "qkv")
        assert k["offset"] == q["offset"] + q["numel"] and v["offset"] == k["offset"] + k["numel"]
        g, u = (p[f"model.layers.{i}.mlp.{x}_proj.weight"] for x in ("gate", "up"))
        assert u["offset"] == g["offset"] + g["numel"]
        assert q["offset"] % ALIGN_ELEMS == 0 and g["offset"] % ALIGN_ELEMS == 0
    decay = [x for x in layout["params"] if x["decay"]]
    no_decay = [x for x in layout["params"] if not x["decay"]]
    assert all(len(x["shape"]) == 2 for x in decay) and all(len(x["shape"]) == 1 for x in no_decay)
    assert max(x["offset"] + x["numel"] for x in decay) <= layout["decay_numel"]
    assert min(x["offset"] for x in no_decay) == layout["decay_numel"]
    assert layout["total_numel"] % ALIGN_ELEMS == 0


def test_init_std():
    layout = build_layout(PRESETS["tiny"])
    p = param_by_name(layout)
    o_proj = p["model.layers.1.self_attn.o_proj.weight"]
    assert o_proj["init_std"] == pytest.approx(0.02 / math.sqrt(4))
    assert p["model.layers.1.mlp.down_proj.weight"]["init_std"] == pytest.approx(0.02 / 2)
    assert p["model.layers.1.mlp.up_proj.weight"]["init_std"] == 0.02
    assert p["model.norm.weight"]["init"] == "ones"


def test_bad_config_rejected():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(n_embd=64, n_head=5)
    with pytest.raises(ValueError, match=f"above {MAX_HEAD_DIM}"):
        ModelConfig(n_embd=2 * (MAX_HEAD_DIM + 2), n_head=2)
    ModelConfig(n_embd=2 * MAX_HEAD_DIM, n_head=2)   # at the limit: fine


def test_head_dim_limit_has_one_source():
    """The engine reads the head-dim limit from the layout; the WGSL const that sizes the
    attention kernels' register rows (a const: private arrays need one) must agree with it."""
    assert build_layout(PRESETS["tiny"])["limits"] == {"max_head_dim": MAX_HEAD_DIM}
    for lib in ("attention.wgsl", "attention_rows.wgsl"):     # tiled and row kernels
        wgsl = (SHADERS / "lib" / lib).read_text()
        assert re.search(r"const MAX_D: u32 = (\d+)u;", wgsl).group(1) == str(MAX_HEAD_DIM)
