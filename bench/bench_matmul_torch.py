"""torch.matmul (cuBLAS: fp32 with TF32 off; --dtypes adds tf32 and fp16) on the matmul shapes
of bench/bench_matmul.mjs: for each of a layer's five linears (q|k|v, o, gate|up, down, lm head)
the forward y = x W^T, the input gradient dx = dy W and the weight gradient dW = dy^T x, with the
operands laid out as the engine holds them (x [M, K], W [N, K], dy [M, N], row-major). CUDA
events, median of --iters. Writes {"preset:rows:name:kind": ms} (fp32) and
{"preset:rows:name:kind:tf32" / ":fp16": ms} for bench_matmul.mjs and bench_matmul_f16.mjs
--torch. fp16 is f16 operands with f32 accumulation (reduced-precision reductions off): what the
WGSL subgroup-matrix kernels compute.

    PYTHONPATH=. python3 bench/bench_matmul_torch.py .gpu/l120.json:8 .gpu/l12.json:32 \
      [--dtypes fp32,tf32,fp16] --out mm.json
"""

import argparse
import json

import torch

from bench.cuda_time import median_ms


def step_shapes(cfg: dict, rows: int) -> list[tuple[str, str, int, int, int, int]]:
    C, F, V, L = cfg["n_embd"], cfg["ffn_dim"], cfg["vocab_size"], cfg["n_layer"]
    out = []
    for name, n, k, calls in (("qkv", 3 * C, C, L), ("o", C, C, L), ("gate_up", 2 * F, C, L),
                              ("down", C, F, L), ("head", V, C, 1)):
        for kind in ("fwd", "dx", "dW"):
            out.append((name, kind, rows, n, k, calls))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+", help="layout.json:batch")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out")
    ap.add_argument("--dtypes", default="fp32", help="comma-separated: fp32, tf32, fp16")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    print(f"torch.matmul {', '.join(dtypes)}, PyTorch {torch.__version__} on "
          f"{torch.cuda.get_device_name()}: GPU ms per call (median of {args.iters}), TFLOP/s")
    result = {}
    for spec in args.specs:
        path, _, batch = spec.partition(":")
        layout = json.load(open(path))["layout"]
        cfg = layout["config"]
        rows = int(batch or 8) * cfg["seq_len"]
        preset = layout.get("preset") or "custom"
        print(f"\n{preset}  M = {rows} rows")
        total: dict[str, float] = {}
        for name, kind, M, N, K, calls in step_shapes(cfg, rows):
            for dtype in dtypes:
                ms = time_shape(kind, M, N, K, dtype, args.iters)
                suffix = "" if dtype == "fp32" else f":{dtype}"
                result[f"{preset}:{rows}:{name}:{kind}{suffix}"] = ms
                total[dtype] = total.get(dtype, 0.0) + calls * ms
                print(f"  {name} {kind:3} {dtype:4} [{M} x {N} x {K}]  {ms:8.3f} ms  "
                      f"{2 * M * N * K / ms / 1e9:6.1f} TFLOP/s")
        for dtype, ms in total.items():
            print(f"{preset}: matmuls of one step (calls x ms): torch {dtype} {ms:.2f} ms")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh)


def time_shape(kind: str, M: int, N: int, K: int, dtype: str, iters: int) -> float:
    """Median ms of one matmul of the step, operands as the engine lays them out."""
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.float16 if dtype == "fp16" else torch.float32
    x = torch.randn(M, K, device="cuda", generator=g).to(dt)
    w = torch.randn(N, K, device="cuda", generator=g).to(dt)
    dy = torch.randn(M, N, device="cuda", generator=g).to(dt)
    if kind == "fwd":
        def f():
            return torch.matmul(x, w.t())
    elif kind == "dx":
        def f():
            return torch.matmul(dy, w)
    else:
        def f():
            return torch.matmul(dy.t(), x)
    return median_ms(f, iters)


if __name__ == "__main__":
    main()
