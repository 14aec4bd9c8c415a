"""Where the 8-bit update's time goes: prints shaders/12_optimizer.wgsl with parts of
adamw_8bit_update replaced by trivial stand-ins (wrong numbers, same memory traffic), for timing.

  python bench/diag_optimizer_8bit.py noquant-nored > /tmp/x.wgsl

Modes, joined by '-': noquant (codes from a bit pattern instead of the nearest-code search),
nodeq (no code-table lookups), nored (per-thread absmax instead of the block's: no barriers).
bench/results/optimizer_h200.txt has the command that swaps the file in and times each mode."""

import sys
from pathlib import Path

QUANT = {
    "codes[cw] = quant_m(xm.x) | (quant_m(xm.y) << 8u) | (quant_m(xm.z) << 16u)"
    " | (quant_m(xm.w) << 24u);": "codes[cw] = bitcast<u32>(xm.x + xm.y + xm.z + xm.w);",
    "codes[cw + 64u] = quant_v(xv.x) | (quant_v(xv.y) << 8u) | (quant_v(xv.z) << 16u)"
    " | (quant_v(xv.w) << 24u);": "codes[cw + 64u] = bitcast<u32>(xv.x + xv.y + xv.z + xv.w);",
}
DEQUANT = {
    "m = dequant_m(r.qm, r.am);": "m = vec4<f32>(f32(r.qm & 0xffu)) * r.am;",
    "v = dequant_v(r.qv, r.av);": "v = vec4<f32>(f32(r.qv >> 8u)) * r.av;",
}
REDUCTION_START = "  s_red[lid] = select("
REDUCTION_END = "  if (live) {\n    if (is8) {\n      // x / absmax"


def swap(src: str, pairs: dict[str, str]) -> str:
    for old, new in pairs.items():
        assert old in src, f"kernel changed: {old!r} not found"
        src = src.replace(old, new)
    return src


def main() -> None:
    src = Path("shaders/12_optimizer.wgsl").read_text()
    modes = set(sys.argv[1].split("-"))
    if "noquant" in modes:
        src = swap(src, QUANT)
    if "nodeq" in modes:
        src = swap(src, DEQUANT)
    if "nored" in modes:
        block = src[src.index(REDUCTION_START):src.index(REDUCTION_END)]
        src = src.replace(block, "  let am = vec2<f32>(max4(abs(m)), max4(v));\n")
    sys.stdout.write(src)


if __name__ == "__main__":
    main()
