"""Optimizer-side tables: bitsandbytes' 8-bit dynamic quantization maps, the 8-bit block plan and
the optimizer state bytes of each variant for a layout (server/model.py).

Pure Python (no torch, no numpy) so it also runs on a bare GPU server for the benchmark:
`python -m andrea.optim 120m > layout.json` prints the layout with maps and state bytes.

The maps equal `bitsandbytes.functional.create_dynamic_map(signed)` bit for bit (tests/
test_optim_maps.py checks it): 256 sorted f32 values in [-1, 1] (signed, for Adam's m) or [0, 1]
(unsigned, for v). An element x of a 256-element block is stored as the index of the map entry
nearest to x / absmax(block).

Variants and their state:
  adamw       M, V: f32 [total_numel] each                                   8 B/param
  adamw_f16   as adamw; plus the f16 mirror of W (not optimizer state)       + 2 B/param mirror
  adamw_8bit  per tensor with numel >= 4096 (bnb's min_8bit_size): codes 1 B per element per state,
              in whole 256-element blocks, plus one f32 absmax per block per state; smaller tensors
              (norm gains) keep f32 m and v, and so does the token embedding (also the tied
              output head) under the default policy "embed_f32"              ~2-4 B/param

Which tensors keep 32-bit state is decided HERE only (block_plan's f32_tensors, sent to the browser
in every layout's optimizer_state.adamw_8bit); the engine follows the list, it never decides.
Policies (F32_POLICIES): "embed_f32" keeps the embedding's state in f32, as bitsandbytes users do
with StableEmbedding / GlobalOptimManager.override_config(emb, "optim_bits", 32); "all" quantizes
every tensor of min_8bit_size elements or more (plain AdamW8bit). bench/bench_fidelity.mjs measures
both against fp32 (bench/results/fidelity_h200.txt).
"""

from __future__ import annotations

import json
import struct
import sys

BLOCKSIZE = 256        # elements per quantization block (bitsandbytes' blockwise default)
MIN_8BIT_SIZE = 4096   # tensors with fewer elements keep f32 state (bitsandbytes' min_8bit_size)
VARIANTS = ("adamw", "adamw_f16", "adamw_8bit")
EMBEDDING = "model.embed_tokens.weight"   # also the output head (tied), server/model.py
F32_POLICIES = {
    "embed_f32": (EMBEDDING,),   # 8-bit elsewhere; the embedding (and tied head) in f32
    "all": (),                   # every tensor of min_8bit_size elements or more in 8-bit
}
DEFAULT_8BIT_POLICY = "embed_f32"


def _f32(x: float) -> float:
    """Round a Python float to the nearest f32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _linspace_f32(start: float, end: float, steps: int) -> list[float]:
    """torch.linspace(start, end, steps, dtype=float32) as torch's CPU kernel computes it: f32 step,
    the first half counted up from `start`, the second down from `end`, each a single rounding
    (the vectorized kernel fuses the multiply-add). Python's double arithmetic is exact here
    (a 24-bit step times a small integer plus a 24-bit start fits in 53 bits)."""
    s, e = _f32(start), _f32(end)
    step = _f32(_f32(e - s) / (steps - 1))
    half = steps // 2
    return [_f32(s + step * i) if i < half else _f32(e - step * (steps - 1 - i))
            for i in range(steps)]


def create_dynamic_map(signed: bool = True, max_exponent_bits: int = 7,
                       total_bits: int = 8) -> list[float]:
    """bitsandbytes' dynamic quantization map (Dettmers, 8-Bit Approximations for Parallelism in
    Deep Learning, https://arxiv.org/abs/1511.04561): per decade a linear fraction grid whose
    resolution shrinks with the exponent. Same arithmetic as bnb's torch code, in f32."""
    data: list[float] = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    i = 0
    for i in range(max_exponent_bits):
        fraction_items = (2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                          else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = _linspace_f32(0.1, 1, fraction_items)
        means = [_f32(_f32(a + b) / 2.0) for a, b in zip(boundaries, boundaries[1:])]
        scale = _f32(10 ** (-(max_exponent_bits - 1) + i))
        data += [_f32(scale * m) for m in means]
        if signed:
            data += [_f32(-scale * m) for m in means]
    if additional_items > 0:
        boundaries = _linspace_f32(0.1, 1, additional_items + 1)
        means = [_f32(_f32(a + b) / 2.0) for a, b in zip(boundaries, boundaries[1:])]
        scale = _f32(10 ** (-(max_exponent_bits - 1) + i))
        data += [_f32(scale * m) for m in means]
        if signed:
            data += [_f32(-scale * m) for m in means]
    data += [0.0, 1.0]
    assert len(data) == 2 ** total_bits
    data += [0.0] * (256 - len(data))
    return sorted(data)


def quantization_maps() -> dict:
    """What the browser's 8-bit optimizer needs: both maps and the blocking rules."""
    return {"signed": create_dynamic_map(True), "unsigned": create_dynamic_map(False),
            "blocksize": BLOCKSIZE, "min_8bit_size": MIN_8BIT_SIZE}


def f32_tensors(layout: dict, policy: str = DEFAULT_8BIT_POLICY) -> list[str]:
    """THE choice of the tensors whose Adam state stays f32 under the 8-bit optimizer, in layout
    order: those under min_8bit_size (norm gains) and those the policy names."""
    if policy not in F32_POLICIES:
        raise ValueError(f"unknown 8-bit policy {policy!r}; known: {', '.join(F32_POLICIES)}")
    keep = F32_POLICIES[policy]
    return [p["name"] for p in layout["params"] if p["numel"] < MIN_8BIT_SIZE or p["name"] in keep]


def block_plan(layout: dict, policy: str = DEFAULT_8BIT_POLICY) -> dict:
    """How the 8-bit optimizer splits the layout: 8-bit blocks never straddle tensors (block b of a
    tensor covers [offset + 256 b, offset + min(256 (b + 1), numel))); the tensors of f32_tensors
    keep f32 state. The engine (static/js/engine/optimizer_tables.js) builds its plan from the
    f32_tensors list given here; sizes must agree."""
    keep = set(f32_tensors(layout, policy))
    q_blocks = 0
    f32_numel = 0
    for p in layout["params"]:
        if p["name"] in keep:
            f32_numel += -(-p["numel"] // 4) * 4
        else:
            q_blocks += -(-p["numel"] // BLOCKSIZE)
    return {"policy": policy, "q_blocks": q_blocks, "f32_numel": f32_numel,
            "f32_tensors": [p["name"] for p in layout["params"] if p["name"] in keep]}


def optimizer_memory(layout: dict, policy: str = DEFAULT_8BIT_POLICY) -> dict:
    """GPU bytes each variant allocates for optimizer state (what optimizer.js allocates), and for
    adamw_8bit the plan itself (f32_tensors: what the engine keeps in f32)."""
    n = layout["total_numel"]
    plan = block_plan(layout, policy)
    fp32 = 2 * 4 * n
    # codes: 256 B per block per state; absmax: one f32 per block per state, padded to 4 floats;
    # f32 m and v for the small tensors.
    q8 = (2 * BLOCKSIZE * plan["q_blocks"]
          + 4 * (-(-2 * plan["q_blocks"] // 4) * 4 + 2 * plan["f32_numel"]))
    n_params = layout["n_params"]
    out = {
        "adamw": {"state_bytes": fp32},
        "adamw_f16": {"state_bytes": fp32, "mirror_bytes": 2 * n},
        "adamw_8bit": {"state_bytes": q8, **plan},
    }
    for v in out.values():
        v["bytes_per_param"] = round(v["state_bytes"] / n_params, 4)
    return out


def checkpoint_sections(layout: dict, optimizer: str, precision: str,
                        policy: str = DEFAULT_8BIT_POLICY) -> list[dict]:
    """THE list of a checkpoint's sections, in file order: raw little-endian bytes, no header,
    no padding. W, then the optimizer state exactly as the GPU holds it (the f16 mirror is
    recomputed from W, so it is not stored); a mixed-precision run's then ends with the loss
    scaler (f32 [4]: scale, clean steps, applied steps, 0), so that it resumes exactly. The
    engine checks its buffers against this list; the server checks upload sizes against it."""
    n = layout["total_numel"]
    scaler = [{"name": "scaler", "bytes": 16}] if precision == "mixed" else []
    if optimizer in ("adamw", "adamw_f16"):
        return [{"name": "W", "bytes": 4 * n}, {"name": "M", "bytes": 4 * n},
                {"name": "V", "bytes": 4 * n}, *scaler]
    if optimizer == "adamw_8bit":
        plan = block_plan(layout, policy)
        # codes: m and v, one byte per element of each 256-element block; small: the absmax
        # pairs (padded to 4 floats), then f32 m and v of the small tensors.
        small = 4 * (-(-2 * plan["q_blocks"] // 4) * 4 + 2 * plan["f32_numel"])
        return [{"name": "W", "bytes": 4 * n},
                {"name": "codes", "bytes": 2 * BLOCKSIZE * plan["q_blocks"]},
                {"name": "small", "bytes": small}, *scaler]
    raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(VARIANTS)}")


def _main(argv: list[str]) -> int:
    from andrea.model import PRESETS, build_layout
    policy = DEFAULT_8BIT_POLICY
    if len(argv) == 3 and argv[1] == "--8bit-policy":
        argv, policy = argv[:1], argv[2]
    if len(argv) != 1 or argv[0] not in PRESETS or policy not in F32_POLICIES:
        print(f"usage: python -m andrea.optim {{{'|'.join(PRESETS)}}} "
              f"[--8bit-policy {{{'|'.join(F32_POLICIES)}}}]", file=sys.stderr)
        return 2
    layout = {"preset": argv[0], **build_layout(PRESETS[argv[0]])}
    layout["optimizer_state"] = optimizer_memory(layout, policy)
    sections = {opt: checkpoint_sections(layout, opt, "fp32", policy)     # an fp32 run's
                for opt in ("adamw", "adamw_8bit")}
    json.dump({"layout": layout, "maps": quantization_maps(), "checkpoint_sections": sections},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
