"""Where the 8-bit update's time goes: prints shaders/12_optimizer.wgsl with parts of
adamw_8bit_update replaced by trivial stand-ins (wrong numbers, same memory traffic), for timing only.

  python bench/diag_optimizer_8bit.py noquant-nored > /tmp/x.wgsl
  modes (joined by '-'): noquant (codes from a bit pattern instead of the nearest-code search),
  nodeq (no code-table lookups), nored (per-thread absmax instead of the block's: no barriers)

bench/results/optimizer_h200.txt has the command that swaps the file in and times each mode."""

import sys
from pathlib import Path

s = Path("shaders/12_optimizer.wgsl").read_text()
mode = sys.argv[1]
if 'noquant' in mode:
    a = "codes[cw] = quant_m(xm.x) | (quant_m(xm.y) << 8u) | (quant_m(xm.z) << 16u) | (quant_m(xm.w) << 24u);"
    b = "codes[cw + 64u] = quant_v(xv.x) | (quant_v(xv.y) << 8u) | (quant_v(xv.z) << 16u) | (quant_v(xv.w) << 24u);"
    assert a in s and b in s
    s = s.replace(a, "codes[cw] = bitcast<u32>(xm.x + xm.y + xm.z + xm.w);")
    s = s.replace(b, "codes[cw + 64u] = bitcast<u32>(xv.x + xv.y + xv.z + xv.w);")
if 'nodeq' in mode:
    a = "m = dequant_m(r.qm, r.am);"; b = "v = dequant_v(r.qv, r.av);"
    assert a in s and b in s
    s = s.replace(a, "m = vec4<f32>(f32(r.qm & 0xffu)) * r.am;").replace(b, "v = vec4<f32>(f32(r.qv >> 8u)) * r.av;")
if 'nored' in mode:
    a = s[s.index("  s_red[lid] = select("):s.index("  if (live) {\n    if (is8) {\n      // x / absmax")]
    s = s.replace(a, "  let am = vec2<f32>(max4(abs(m)), max4(v));\n")
sys.stdout.write(s)
