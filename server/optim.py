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
              (norm gains) keep f32 m and v                                   ~2.03 B/param
"""

from __future__ import annotations

import json
import struct
import sys

BLOCKSIZE = 256        # elements per quantization block (bitsandbytes' blockwise default)
MIN_8BIT_SIZE = 4096   # tensors with fewer elements keep f32 state (bitsandbytes' min_8bit_size)
VARIANTS = ("adamw", "adamw_f16", "adamw_8bit")


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


def block_plan(layout: dict) -> dict:
    """How the 8-bit optimizer splits the layout: 8-bit blocks never straddle tensors (block b of a
    tensor covers [offset + 256 b, offset + min(256 (b + 1), numel))), small tensors keep f32 state.
    The engine (static/js/engine/optimizer_tables.js) builds the same plan; sizes must agree."""
    q_blocks = 0
    f32_numel = 0
    for p in layout["params"]:
        if p["numel"] >= MIN_8BIT_SIZE:
            q_blocks += -(-p["numel"] // BLOCKSIZE)
        else:
            f32_numel += -(-p["numel"] // 4) * 4
    return {"q_blocks": q_blocks, "f32_numel": f32_numel}


def optimizer_memory(layout: dict) -> dict:
    """GPU bytes each variant allocates for optimizer state (what optimizer.js allocates)."""
    n = layout["total_numel"]
    plan = block_plan(layout)
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


def checkpoint_sections(layout: dict, optimizer: str) -> list[dict]:
    """THE list of a checkpoint's sections, in file order: raw little-endian bytes, no header,
    no padding. W, then the optimizer state exactly as the GPU holds it (the f16 mirror is
    recomputed from W, so it is not stored). The engine checks its buffers against this list;
    the server checks upload sizes against it."""
    n = layout["total_numel"]
    if optimizer in ("adamw", "adamw_f16"):
        return [{"name": "W", "bytes": 4 * n}, {"name": "M", "bytes": 4 * n},
                {"name": "V", "bytes": 4 * n}]
    if optimizer == "adamw_8bit":
        plan = block_plan(layout)
        # codes: m and v, one byte per element of each 256-element block; small: the absmax
        # pairs (padded to 4 floats), then f32 m and v of the small tensors.
        small = 4 * (-(-2 * plan["q_blocks"] // 4) * 4 + 2 * plan["f32_numel"])
        return [{"name": "W", "bytes": 4 * n},
                {"name": "codes", "bytes": 2 * BLOCKSIZE * plan["q_blocks"]},
                {"name": "small", "bytes": small}]
    raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(VARIANTS)}")


def _main(argv: list[str]) -> int:
    from andrea.model import PRESETS, build_layout
    if len(argv) != 1 or argv[0] not in PRESETS:
        print(f"usage: python -m andrea.optim {{{'|'.join(PRESETS)}}}", file=sys.stderr)
        return 2
    layout = {"preset": argv[0], **build_layout(PRESETS[argv[0]])}
    layout["optimizer_state"] = optimizer_memory(layout)
    sections = {opt: checkpoint_sections(layout, opt) for opt in ("adamw", "adamw_8bit")}
    json.dump({"layout": layout, "maps": quantization_maps(), "checkpoint_sections": sections},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
