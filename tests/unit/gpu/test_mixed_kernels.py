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

from tests import reference as ref
from tests.lab import call
from tests.unit.gpu.test_kernels import op, randn

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


U16 = 2.0 ** -11     # f16's unit roundoff (round to nearest)


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def heads(t: torch.Tensor, B: int, T: int, parts: int, H: int, D: int) -> torch.Tensor:
    """[B*T, parts*H*D] -> [parts, B, H, T, D]"""
    return t.reshape(B, T, parts, H, D).permute(2, 0, 3, 1, 4)


def rows(t: torch.Tensor) -> np.ndarray:
    """[parts, B, H, T, D] -> [B*T, parts*H*D], as the engine lays it out"""
    parts, B, H, T, D = t.shape
    return t.permute(1, 3, 0, 2, 4).reshape(B * T, parts * H * D).numpy()


def attention_bounds(qkv: np.ndarray, dy: np.ndarray, B: int, T: int, H: int, D: int):
    """Float64 attention on q, k, v and dO rounded to f16, as the mixed kernels round them
    (mma_attention.js; delta = dO . y in f32, as the fp32 kernels take it), with the error bound
    of each output. The kernels round two more operands
    to f16, P (for P v and P^T dO) and scale * dS (for dS k and dS^T q): each product's error is
    then u16 * |A| @ |B| (u16 = 2^-11), plus what f32 adds: the scores' sums over D products make
    P's relative error E (in the exponent and in the row sum), dP and delta's sums over D make dS's,
    and the T-term sums of the outputs gamma_T. Returns (y, lse, dqkv) and their bounds, laid out
    as the engine's buffers."""
    x = heads(torch.from_numpy(qkv).half().double(), B, T, 3, H, D)
    q, k, v = x[0], x[1], x[2]
    dO = heads(torch.from_numpy(dy).half().double(), B, T, 1, H, D)[0]
    scale = D ** -0.5
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(mask, float("-inf"))
    P = torch.softmax(s, -1)
    lse = torch.logsumexp(s, -1)
    y = P @ v
    qk = (q.abs() @ k.abs().transpose(-1, -2) * scale).masked_fill(mask, 0)
    E = 2 * gamma(D) * float(qk.max()) + gamma(T) + 8 * U
    y_bound = (U16 + E + gamma(T)) * (P @ v.abs())
    lse_bound = 2 * gamma(D) * float(qk.max()) + gamma(T) + 8 * U * lse.abs()
    # The backward, from the f32 y the test hands it. delta = dO . y is the fp32 kernels' (f32,
    # of the unrounded dO); dP = dO v^T takes dO rounded.
    y32 = y.float().double()
    dO32 = heads(torch.from_numpy(dy).double(), B, T, 1, H, D)[0]
    dP = dO @ v.transpose(-1, -2)
    delta = (dO32 * y32).sum(-1, keepdim=True)
    dS = P * (dP - delta)
    A = (U16 * dS.abs() + E * P * (dP - delta).abs()
         + P * (gamma(D) * (dO.abs() @ v.abs().transpose(-1, -2))
                + gamma(D + 1) * (dO32.abs() * y32.abs()).sum(-1, keepdim=True)))
    dq = scale * dS @ k
    dk = scale * dS.transpose(-1, -2) @ q
    dv = P.transpose(-1, -2) @ dO
    dq_b = scale * (A @ k.abs() + gamma(T) * dS.abs() @ k.abs())
    dk_b = scale * (A.transpose(-1, -2) @ q.abs() + gamma(T) * dS.abs().transpose(-1, -2) @ q.abs())
    dv_b = (U16 + E + gamma(T)) * (P.transpose(-1, -2) @ dO.abs())
    return ((rows(y[None]), lse.numpy().ravel(), rows(torch.stack([dq, dk, dv]))),
            (rows(y_bound[None]), lse_bound.numpy().ravel(), rows(torch.stack([dq_b, dk_b, dv_b]))))


# 64-row blocks of head dims 64 (12m's and 120m's), 16 (tiny's, at tiny's T), 32 and 48; with T from
# 128 on, dS goes through memory (the model's dS buffer), below it dq recomputes it.
@pytest.mark.parametrize("B,T_,H,D", [(2, 128, 2, 64), (1, 64, 3, 16), (1, 192, 2, 32),
                                       (1, 128, 1, 48)])
def test_mixed_attention_matches_torch_on_f16_operands(lab_session, B, T_, H, D):
    mixed = call(lab_session, "return lab.info.mixed;")
    if not mixed["ok"]:
        pytest.skip(f"no f16 subgroup matrices here: {mixed['why']}")
    qkv, dy = randn(B * T_, 3 * H * D), randn(B * T_, H * D)
    (y, lse, dqkv), (y_b, lse_b, dqkv_b) = attention_bounds(qkv, dy, B, T_, H, D)
    out = op(lab_session, "attentionMixed", qkv=qkv, B=B, T=T_, H=H, D=D)
    back = op(lab_session, "attentionBackwardMixed", qkv=qkv, y=y.astype(np.float32), dy=dy,
              lse=lse.astype(np.float32), B=B, T=T_, H=H, D=D)
    for name, got, want, tol in (("y", out["y"], y, y_b), ("lse", out["lse"], lse, lse_b),
                                 ("dqkv", back["dqkv"], dqkv, dqkv_b)):
        err = np.abs(got.astype(np.float64) - want.ravel())
        ratio = err / tol.ravel()
        i = int(ratio.argmax())
        row, col = divmod(i, want.shape[-1]) if want.ndim == 2 else (0, i)
        assert (err <= tol.ravel()).all(), (
            f"{name}: worst err/bound {ratio[i]:.3g} at row {row} column {col}: got {got[i]:.6g}, "
            f"want {want.ravel()[i]:.6g}, bound {tol.ravel()[i]:.3g}")
    # The matrix units ran: against float64 attention of the unrounded inputs, y is off by more
    # than f32 arithmetic would be.
    exact, _ = ref.attention(torch.from_numpy(qkv).double(), B, T_, H, D)
    assert (np.abs(out["y"] - exact.numpy().ravel()) > 1e-5 * np.abs(exact.numpy()).max()).any(), \
        "y equals f32 attention: the mixed kernels did not run"
    # dS through memory or recomputed in dq: the same bits.
    again = op(lab_session, "attentionBackwardMixed", qkv=qkv, y=y.astype(np.float32), dy=dy,
               lse=lse.astype(np.float32), B=B, T=T_, H=H, D=D, dsPath=False)
    assert np.array_equal(again["dqkv"], back["dqkv"])
