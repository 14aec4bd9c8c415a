"""torch.matmul (cuBLAS, fp32, TF32 off) on the matmul shapes of bench/bench_matmul.mjs: for each of
a layer's five linears (q|k|v, o, gate|up, down, lm head) the forward y = x W^T, the input gradient
dx = dy W and the weight gradient dW = dy^T x, with the operands laid out as the engine holds them
(x [M, K], W [N, K], dy [M, N], row-major). CUDA events, median of --iters. Writes
{"preset:rows:name:kind": ms} for bench_matmul.mjs --torch.

    PYTHONPATH=. python3 bench/bench_matmul_torch.py .gpu/l120.json:8 .gpu/l12.json:32 --out mm.json
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
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch.matmul fp32 (TF32 off), PyTorch {torch.__version__} on "
          f"{torch.cuda.get_device_name()}: GPU ms per call (median of {args.iters}), TFLOP/s")
    result = {}
    for spec in args.specs:
        path, _, batch = spec.partition(":")
        layout = json.load(open(path))["layout"]
        cfg = layout["config"]
        rows = int(batch or 8) * cfg["seq_len"]
        preset = layout.get("preset") or "custom"
        print(f"\n{preset}  M = {rows} rows")
        total = 0.0
        for name, kind, M, N, K, calls in step_shapes(cfg, rows):
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(M, K, device="cuda", generator=g)
            w = torch.randn(N, K, device="cuda", generator=g)
            dy = torch.randn(M, N, device="cuda", generator=g)
            if kind == "fwd":
                def f(x=x, w=w):
                    return torch.matmul(x, w.t())
            elif kind == "dx":
                def f(dy=dy, w=w):
                    return torch.matmul(dy, w)
            else:
                def f(dy=dy, x=x):
                    return torch.matmul(dy.t(), x)
            ms = median_ms(f, args.iters)
            result[f"{preset}:{rows}:{name}:{kind}"] = ms
            total += calls * ms
            print(f"  {name} {kind:3} [{M} x {N} x {K}]  {ms:8.3f} ms  "
                  f"{2 * M * N * K / ms / 1e9:5.1f} TFLOP/s")
            del x, w, dy
        print(f"{preset}: matmuls of one step (calls x ms): torch {total:.2f} ms")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
