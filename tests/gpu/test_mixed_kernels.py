"""The mixed-precision linears (static/js/engine/mma.js through kernels.js: f16 operands, f32
accumulation on the GPU's matrix units) against PyTorch: forward y = x W^T, input gradient dx = dy W
and weight gradient dW = dy^T x (split-K included), with the operands rounded to f16 as torch's
.half() rounds them (to nearest, ties to even) and the products summed exactly (float64).

Tolerance: an f32 sum of K products of f16 values (each exact in f32) is within
gamma_K * sum_k |a_k b_k| of the exact sum, gamma_K = K u / (1 - K u), u = 2^-24 (Higham's bound
for any summation order), so every element is held to that bound. The same output against the
products of the unrounded operands must be far outside it: the kernel rounded its operands.

Runs wherever the lab's adapter has f16 subgroup matrices (lab.info.mixed): on an H200 with
ANDREA_GPU_BROWSER=1; SwiftShader has none, so CI skips it (its fp32 kernels are test_kernels.py's).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.gpu.test_kernels import op, randn
from tests.lab import call

U = 2.0 ** -24


def bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gamma_K * (|a| @ |b|) for the product a @ b (float64)."""
    K = a.shape[1]
    return K * U / (1 - K * U) * (a.abs() @ b.abs())


# The engine tile (128 x 128 x 32), then shapes only smaller tiles fill (mma_ops.js mmaTile): tiny's
# q|k|v at B 4, and a custom width of 48 with an FFN of 96 (16 x 16 tiles).
@pytest.mark.parametrize("M,N,K", [(256, 384, 128), (1024, 384, 256), (256, 192, 64),
                                   (128, 48, 96)])
def test_mixed_linears_match_torch_on_f16_operands(lab_session, M, N, K):
    mixed = call(lab_session, "return lab.info.mixed;")
    if not mixed["ok"]:
        pytest.skip(f"no f16 subgroup matrices here: {mixed['why']}")
    x, w, dy = randn(M, K), randn(N, K), randn(M, N)
    out = op(lab_session, "linearMixed", x=x, w=w, dy=dy, M=M, N=N, K=K)
    h = {k: torch.from_numpy(v).half().double() for k, v in (("x", x), ("w", w), ("dy", dy))}
    full = {k: torch.from_numpy(v).double() for k, v in (("x", x), ("w", w), ("dy", dy))}
    for name, got, a, b in (("y", out["y"], "x", "w.T"), ("dx", out["dx"], "dy", "w"),
                            ("dw", out["dw"], "dy.T", "x")):
        def operand(spec, src):
            t = src[spec.split(".")[0]]
            return t.T if spec.endswith(".T") else t
        A, B = operand(a, h), operand(b, h)
        exact = A @ B
        g = torch.from_numpy(got.astype(np.float64)).reshape(exact.shape)
        err = (g - exact).abs()
        tol = bound(A, B)
        assert (err <= tol).all(), f"{name}: worst err/bound {float((err / tol).max()):.3g}"
        unrounded = operand(a, full) @ operand(b, full)
        assert ((g - unrounded).abs() > bound(operand(a, full), operand(b, full))).any(), \
            f"{name}: equals the f32 product: the mixed kernel did not run"
