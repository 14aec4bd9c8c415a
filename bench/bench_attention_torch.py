"""PyTorch's causal scaled_dot_product_attention (FlashAttention on a CUDA GPU for f16/bf16) on the
attention shapes of the 12m and 120m presets: forward, and forward + backward, per layer, in fp32,
fp16 and bf16. CUDA events, median of --iters. The counterpart of bench_attention_mma.mjs's
figures for the engine's kernels (bench/results/attention_mma_h100.txt).

    PYTHONPATH=. python3 bench/bench_attention_torch.py [--iters 20]
"""

import argparse

import torch
import torch.nn.functional as F

from bench.cuda_time import median_ms

SHAPES = {"12m B32": (32, 6, 256, 64), "120m B8": (8, 12, 1024, 64)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: causal SDPA, "
          "ms per layer")
    for name, (B, H, T, D) in SHAPES.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dtype, requires_grad=True)
                       for _ in range(3))
            dy = torch.randn(B, H, T, D, device="cuda", dtype=dtype)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(y, (q, k, v), dy)

            f, fb = median_ms(fwd, args.iters), median_ms(fwd_bwd, args.iters)
            print(f"  {name:8s} {str(dtype).removeprefix('torch.'):8s} forward {f:.3f}  "
                  f"backward {fb - f:.3f}  (forward + backward {fb:.3f})")


if __name__ == "__main__":
    main()
