"""Model presets and THE parameter table: the single place the weight layout is computed.

Shapes follow Hugging Face `LlamaForCausalLM` ([out, in] like nn.Linear), names too, so export is
a rename-free safetensors write. All weights live in one f32 buffer W; grads G and Adam moments
M, V share W's offsets. Decay tensors (matrices) come first, then no-decay tensors (norm gains),
so the optimizer covers both with one range and a boundary index.

Legend: V vocab, C channels, L layers, H heads, D = C / H head dim, F FFN width, T context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache

from andrea.tasks import VOCAB as TASK_VOCAB

# minStorageBufferOffsetAlignment is 256 bytes on every adapter we target. Tensors start on
# 512-byte (128-element) boundaries so that the f16 mirror (2 bytes per element, same element
# offsets) is 256-byte aligned too, and every tensor has its own sub-range binding in both.
ALIGN_BYTES = 512
ALIGN_ELEMS = ALIGN_BYTES // 4

# The attention kernels hold a head row in registers sized for at most this head dim
# (shaders/lib/attention.wgsl MAX_D, a WGSL const because private arrays need one; tests/
# test_model_layout.py checks they agree). Sent in every layout as limits.max_head_dim: the engine
# reads it from there.
MAX_HEAD_DIM = 128


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512        # V
    n_embd: int = 64             # C
    n_layer: int = 2             # L
    n_head: int = 4              # H
    ffn_dim: int = 192           # F (SwiGLU hidden width)
    seq_len: int = 64            # T (maximum context)
    norm_eps: float = 1e-5       # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base
    init_std: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "n_embd", "n_layer", "n_head", "ffn_dim", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim ({self.head_dim}) above {MAX_HEAD_DIM} is not supported "
                             "by the attention kernels")
        if self.vocab_size > 65536:
            raise ValueError("vocab_size above 65536 is not supported (token files are uint16)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return {**asdict(self), "head_dim": self.head_dim}


PRESETS: dict[str, ModelConfig] = {
    # CI and parity: a step stays well under a second on SwiftShader.
    "tiny": ModelConfig(vocab_size=512, n_embd=64, n_layer=2, n_head=4, ffn_dim=192, seq_len=64),
    # The toy tasks' (tasks.py; a task run's vocabulary is its alphabet's 16): in PyTorch
    # (bench/tasks_torch.py) reverse of 10 digits reached 99% exact match in 500 steps at width
    # 128 and stayed near 0% at tiny's 64; 3-digit addition reached 99% in 1350 steps with 3
    # layers.
    "toy": ModelConfig(vocab_size=512, n_embd=128, n_layer=3, n_head=4, ffn_dim=384, seq_len=64),
    "12m": ModelConfig(vocab_size=8192, n_embd=384, n_layer=6, n_head=6, ffn_dim=1024, seq_len=256),
    "120m": ModelConfig(vocab_size=8192, n_embd=768, n_layer=12, n_head=12, ffn_dim=3072,
                        seq_len=1024),
}


# A run may give its own shape instead of its preset's (RunConfig: n_layer, n_embd, n_head,
# ffn_dim, vocab_size; seq_len past the preset's context lengthens it). These are the fields
# a run may override, and the vocabulary sizes it may ask for: each is a tokenizer trained once
# per corpus and cached, so the set is small and fixed (powers of two, and the presets').
SHAPE_FIELDS = ("vocab_size", "n_layer", "n_embd", "n_head", "ffn_dim")
VOCAB_SIZES = tuple(sorted({2 ** k for k in range(9, 17)}
                          | {c.vocab_size for c in PRESETS.values()}))


def shaped_model(preset: str, shape: Mapping[str, int | None], task: bool,
                 seq_len: int | None) -> ModelConfig:
    """The model of preset `preset` with the SHAPE_FIELDS `shape` gives on top (each absent or
    None is the preset's); a toy task's vocabulary is its alphabet's (tasks.py). The context is
    the preset's, or `seq_len` where that is longer (RoPE has no learned positions, so only the
    declared maximum changes). What run_config.run_model makes of a run config."""
    base = PRESETS[preset]
    fields = {k: shape.get(k) or getattr(base, k) for k in SHAPE_FIELDS}
    if task:
        fields["vocab_size"] = TASK_VOCAB
    return ModelConfig(**fields, seq_len=max(base.seq_len, seq_len or 0))


@lru_cache(maxsize=128)
def model_layout(preset: str | None, cfg: ModelConfig) -> dict:
    """The parameter table of model `cfg` (build_layout) labelled with its preset's name:
    computed once per model and shared by every caller, who must never change it (copy it to
    add to it: {**layout, ...})."""
    return {"preset": preset, **build_layout(cfg)}


def _align(n: int) -> int:
    return -(-n // ALIGN_ELEMS) * ALIGN_ELEMS


def _param_specs(cfg: ModelConfig) -> list[dict]:
    """(name, shape, decay, init, init_std, group, layer) in buffer order: decay block, then
    no-decay. `layer` is what the pages and the spike anatomy group a tensor by: "embed",
    "layer {i}" or "final norm"; the table lists them in that order first (the decay block).

    Tensors sharing a `group` are laid back to back (q,k,v and gate,up) so one sub-range
    binding covers them and the projection runs as one fused matmul.
    """
    C, F, V = cfg.n_embd, cfg.ffn_dim, cfg.vocab_size
    std = cfg.init_std
    resid_std = std / math.sqrt(2 * cfg.n_layer)  # residual output projections (GPT-2 style)
    specs = [dict(name="model.embed_tokens.weight", shape=[V, C], decay=True, init="normal",
                  init_std=std, group=None, layer="embed")]
    for i in range(cfg.n_layer):
        p, layer = f"model.layers.{i}.", f"layer {i}"
        specs += [
            dict(name=p + "self_attn.q_proj.weight", shape=[C, C], group=f"{p}qkv"),
            dict(name=p + "self_attn.k_proj.weight", shape=[C, C], group=f"{p}qkv"),
            dict(name=p + "self_attn.v_proj.weight", shape=[C, C], group=f"{p}qkv"),
            dict(name=p + "self_attn.o_proj.weight", shape=[C, C], init_std=resid_std),
            dict(name=p + "mlp.gate_proj.weight", shape=[F, C], group=f"{p}gate_up"),
            dict(name=p + "mlp.up_proj.weight", shape=[F, C], group=f"{p}gate_up"),
            dict(name=p + "mlp.down_proj.weight", shape=[C, F], init_std=resid_std),
        ]
        for s in specs[-7:]:
            s["layer"] = layer
    for s in specs:
        s.setdefault("decay", True)
        s.setdefault("init", "normal")
        s.setdefault("init_std", std)
        s.setdefault("group", None)
    for i in range(cfg.n_layer):
        p, layer = f"model.layers.{i}.", f"layer {i}"
        specs += [dict(name=p + "input_layernorm.weight", shape=[C], layer=layer),
                  dict(name=p + "post_attention_layernorm.weight", shape=[C], layer=layer)]
    specs.append(dict(name="model.norm.weight", shape=[C], layer="final norm"))
    for s in specs:
        s.setdefault("decay", False)
        s.setdefault("init", "ones")
        s.setdefault("init_std", 0.0)
        s.setdefault("group", None)
    return specs


def build_layout(cfg: ModelConfig) -> dict:
    """The parameter table plus buffer sizes. Offsets and sizes are in f32 elements."""
    params = []
    offset = 0
    prev_group = None
    for s in _param_specs(cfg):
        # Each tensor starts aligned, except inside a group, where tensors stay contiguous.
        if s["group"] is None or s["group"] != prev_group:
            offset = _align(offset)
        numel = math.prod(s["shape"])
        params.append({**s, "offset": offset, "numel": numel})
        offset += numel
        prev_group = s["group"]
    decay_end = max(p["offset"] + p["numel"] for p in params if p["decay"])
    no_decay_start = min(p["offset"] for p in params if not p["decay"])
    total = _align(offset)
    layout = {
        "config": cfg.to_dict(),
        "params": params,
        "n_params": sum(p["numel"] for p in params),
        "total_numel": total,          # W, G, M, V each hold this many f32 (padding is zero)
        "decay_numel": no_decay_start,  # [0, decay_numel) decays; [decay_numel, total) does not
        "align_elems": ALIGN_ELEMS,
        "limits": {"max_head_dim": MAX_HEAD_DIM},   # what the engine's kernels support
    }
    _check_layout(layout, decay_end)
    return layout


def _check_layout(layout: dict, decay_end: int) -> None:
    params = layout["params"]
    for a, b in zip(params, params[1:]):
        assert a["offset"] + a["numel"] <= b["offset"], f"{a['name']} overlaps {b['name']}"
        if b["group"] is not None and a["group"] == b["group"]:
            assert a["offset"] + a["numel"] == b["offset"], f"group {a['group']} not contiguous"
    for p in params:
        if p["group"] is None or p["name"].endswith(("q_proj.weight", "gate_proj.weight")):
            assert p["offset"] % ALIGN_ELEMS == 0, f"{p['name']} is not {ALIGN_BYTES}-byte aligned"
    assert decay_end <= layout["decay_numel"], "decay and no-decay blocks interleave"
    assert layout["total_numel"] >= params[-1]["offset"] + params[-1]["numel"]


def param_by_name(layout: dict) -> dict[str, dict]:
    return {p["name"]: p for p in layout["params"]}


def preset_layout(name: str) -> dict:
    """A preset's parameter table (model_layout's: shared, never to be changed)."""
    if name not in PRESETS:
        raise KeyError(name)
    return model_layout(name, PRESETS[name])
