"""Each WGSL kernel, forward and backward, against PyTorch on CPU, on shapes that are not
multiples of the tile sizes (matmul tile 32, BK 16; reduction workgroups 64).

Tolerance: max |engine - torch| <= TOL * max(|torch|) per output. fp32 sums over at most a
few hundred terms in a different order than torch's differ by ~1e-7..1e-6 relative, so
TOL = 1e-5 passes a correct kernel and fails a wrong index, transpose or mask (errors of the
size of the values themselves)."""

import numpy as np
import pytest
import torch

from tests import reference as ref
from tests.lab import b64, call

TOL = 1e-5
rng = np.random.default_rng(1234)


def randn(*shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def check(name, got, want, tol=TOL):
    want = np.asarray(want, dtype=np.float32).ravel()
    got = np.asarray(got, dtype=np.float32).ravel()
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    scale = max(float(np.max(np.abs(want))), 1e-30)
    assert err <= tol * scale, f"{name}: max abs diff {err:.3e} > {tol:g} x max|ref| {scale:.3e}"


def op(page, name, **args):
    enc = {k: b64(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    return call(page, f"return await lab.ops.{name}(args);", enc)


def T(x, grad=False):
    return torch.tensor(x, requires_grad=grad)


def same_bits(name, got):
    """Both launches (a GPU's and a software adapter's) gave the same bits, output by output."""
    for key in got["gpu"]:
        assert np.array_equal(np.asarray(got["gpu"][key]), np.asarray(got["software"][key])), \
            f"{name}.{key}: software != gpu bits"


# (1000, 40, 24): dW split over 3 row ranges (32 x 32 tiles); (1000, 300, 230): past
# kernels.js BIG_MATMUL, so 64 x 64 tiles in all three matmuls and dW split 3 ways;
# (1031, 515, 509): past WIDE_MATMUL (2^28 multiply-adds), so the wide tiles (64 x 128 forward
# and input gradient, 128 x 128 weight gradient split 4 ways), with partial tiles on every edge;
# (2049, 2050, 64): a forward of 17 x 17 tiles of 128 x 128, which takes the 128 x 128 tile.
@pytest.mark.parametrize("M,N,K", [(37, 45, 19), (64, 96, 33), (5, 130, 70), (133, 70, 150),
                                   (1000, 40, 24), (1000, 300, 230), (1031, 515, 509),
                                   (2049, 2050, 64)])
def test_linear_forward_backward(lab_session, M, N, K):
    x, w, dy = randn(M, K), randn(N, K), randn(M, N)
    xt, wt = T(x, True), T(w, True)
    y = xt @ wt.T
    y.backward(T(dy))
    # Both launches of the fp32 matmuls: a GPU's tiles and a software adapter's direct kernel
    # (matmul_tiles.js matmulLaunch), whatever this adapter is.
    got = {}
    for adapter in ("gpu", "software"):
        out = op(lab_session, "linear", x=x, w=w, M=M, N=N, K=K, adapter=adapter)
        back = op(lab_session, "linearBackward", dy=dy, x=x, w=w, M=M, N=N, K=K, adapter=adapter)
        check(f"{adapter} linear.y", out["y"], y.detach())
        check(f"{adapter} linear.dx", back["dx"], xt.grad)
        check(f"{adapter} linear.dw", back["dw"], wt.grad)
        got[adapter] = {"y": out["y"], "dx": back["dx"], "dw": back["dw"]}
    # Each output sums in the same order in both, so a run's bits never depend on the adapter
    # (a run resumed on another machine goes on exactly).
    same_bits("linear", got)


@pytest.mark.parametrize("batch", ["random", "one token", "few tokens"])
def test_embed_forward_backward(lab_session, batch):
    V, C, N = 53, 70, 90  # C over the backward's 64 threads per row
    tokens = rng.integers(0, V, N).astype(np.int32)
    tokens[:5] = 7  # repeated tokens must accumulate
    if batch == "one token":
        tokens[:] = V - 1  # every position in one bucket, the last row
    elif batch == "few tokens":
        tokens = rng.choice([0, 2, 3], N).astype(np.int32)  # most rows absent from the batch
    wte, dx = randn(V, C), randn(N, C)
    out = op(lab_session, "embed", tokens=tokens, wte=wte, N=N, C=C)
    w = T(wte, True)
    x = torch.nn.functional.embedding(torch.from_numpy(tokens.astype(np.int64)), w)
    check("embed.x", out["x"], x.detach())
    x.backward(T(dx))
    back = op(lab_session, "embedBackward", tokens=tokens, dx=dx, N=N, C=C, V=V)
    check("embed.dwte", back["dwte"], w.grad)


# Rows up to 256 long take 8 threads (kernels.js rowThreads; on a software adapter one thread
# does the 8 threads' work, rowLaunch), longer ones 64; tails of 2, 0, 5 and 4 past the last
# whole round of 8.
@pytest.mark.parametrize("N,C", [(33, 50), (7, 200), (150, 37), (5, 300)])
def test_rmsnorm_forward_backward(lab_session, N, C):
    eps = 1e-5
    x, g, dy = randn(N, C), 1 + randn(C, scale=0.1), randn(N, C)
    xt, gt = T(x, True), T(g, True)
    y = ref.rmsnorm(xt, gt, eps)
    y.backward(T(dy))
    got = {}
    for adapter in ("gpu", "software"):
        out = op(lab_session, "rmsnorm", x=x, g=g, N=N, C=C, eps=eps, adapter=adapter)
        check("rmsnorm.y", out["y"], y.detach())
        check("rmsnorm.rstd", out["rstd"], torch.rsqrt(xt.detach().pow(2).mean(-1) + eps))
        back = op(lab_session, "rmsnormBackward", dy=dy, x=x, g=g, rstd=out["rstd"], N=N, C=C,
                  adapter=adapter)
        check("rmsnorm.dx", back["dx"], xt.grad)
        check("rmsnorm.dg", back["dg"], gt.grad)
        got[adapter] = {"y": out["y"], "rstd": out["rstd"], "dx": back["dx"], "dg": back["dg"]}
    same_bits("rmsnorm", got)


def test_rope_forward_and_inverse(lab_session):
    B, T_, H, D, theta = 2, 37, 3, 10, 10000.0
    qkv = randn(B * T_, 3 * H * D)
    out = op(lab_session, "rope", qkv=qkv, B=B, T=T_, H=H, D=D, theta=theta)
    x = T(qkv, True)
    y = ref.rope(x, B, T_, H, D, theta)
    check("rope.y", out["qkv"], y.detach())
    # Backward is the transpose rotation: grad of <y, dy> with respect to x.
    dy = randn(B * T_, 3 * H * D)
    y.backward(T(dy))
    back = op(lab_session, "rope", qkv=dy, B=B, T=T_, H=H, D=D, theta=theta, inverse=True)
    check("rope.dx", back["qkv"], x.grad)


# Row kernels below T 128 (kernels.js ATTENTION_TILED_T), tiled ones from it: both, for odd head
# dims, several batches and heads, T not a multiple of the 64-row block, head dim 128. Below T 128
# a GPU and a software adapter launch different kernels (the row kernels, attention_direct.js's):
# both, whatever this adapter is, each against torch and the two bit for bit.
@pytest.mark.parametrize("B,T_,H,D", [(2, 37, 3, 10), (1, 70, 2, 16), (1, 100, 2, 128),
                                       (2, 133, 3, 64), (1, 130, 2, 10), (1, 150, 2, 128)])
def test_attention_forward_backward(lab_session, B, T_, H, D):
    qkv, dy = randn(B * T_, 3 * H * D), randn(B * T_, H * D)
    x = T(qkv, True)
    y, lse = ref.attention(x, B, T_, H, D)
    y.backward(T(dy))
    got = {}
    for adapter in ("gpu", "software") if T_ < 128 else ("gpu",):
        out = op(lab_session, "attention", qkv=qkv, B=B, T=T_, H=H, D=D, adapter=adapter)
        check(f"{adapter} attention.y", out["y"], y.detach())
        check(f"{adapter} attention.lse", out["lse"], lse.detach())
        back = op(lab_session, "attentionBackward", qkv=qkv, y=out["y"], dy=dy, lse=out["lse"],
                  B=B, T=T_, H=H, D=D, adapter=adapter)
        check(f"{adapter} attention.dqkv", back["dqkv"], x.grad)
        got[adapter] = {"y": out["y"], "lse": out["lse"], "delta": back["delta"],
                        "dqkv": back["dqkv"]}
    if "software" in got:
        same_bits("attention", got)
    # The tiled kernels take dS through memory where the adapter binds the T x T buffer and
    # recompute it in dq where not: the same bits either way.
    again = op(lab_session, "attentionBackward", qkv=qkv, y=out["y"], dy=dy, lse=out["lse"],
               B=B, T=T_, H=H, D=D, dsPath=False)
    assert np.array_equal(again["dqkv"], back["dqkv"])
    assert np.array_equal(again["delta"], back["delta"])


def test_swiglu_forward_backward(lab_session):
    N, F = 29, 75
    gu, dh = randn(N, 2 * F, scale=2.0), randn(N, F)
    out = op(lab_session, "swiglu", gu=gu, N=N, F=F)
    x = T(gu, True)
    h = ref.swiglu(x, F)
    check("swiglu.h", out["h"], h.detach())
    h.backward(T(dh))
    back = op(lab_session, "swigluBackward", gu=gu, dh=dh, N=N, F=F)
    check("swiglu.dgu", back["dgu"], x.grad)


# kernels.js: rows up to 1024 long take 8 threads (on a software adapter one thread doing their
# work, rowLaunch), longer ones 64 (each a reduction tree). Both launches, each against torch and
# the two bit for bit.
@pytest.mark.parametrize("N,V", [(45, 515), (3, 70), (9, 1500)])
def test_cross_entropy_and_dlogits(lab_session, N, V):
    logits = randn(N, V, scale=3.0)
    logits[N - 1, 1] = 60.0     # a collapsed row: one token holds all of its probability
    targets = rng.integers(0, V, N).astype(np.int32)
    x = T(logits, True)
    loss = torch.nn.functional.cross_entropy(x, torch.from_numpy(targets.astype(np.int64)))
    loss.backward()
    # The numerical-edge statistics: each row's max |logit| and its max-subtracted softmax
    # denominator, and the batch's extremes of both.
    xd = torch.from_numpy(logits)
    row_max = xd.abs().amax(dim=1)
    denom = torch.exp(xd - xd.amax(dim=1, keepdim=True)).sum(dim=1)
    got = {}
    for adapter in ("gpu", "software"):
        out = op(lab_session, "crossEntropy", logits=logits, targets=targets, N=N, V=V,
                 adapter=adapter)
        check("cross_entropy.loss", out["losses"][N:N + 1], [loss.detach().item()])
        check("cross_entropy.dlogits", out["logits"], x.grad)
        rows = np.asarray(out["losses"][N + 4:], dtype=np.float32).reshape(N, 2)
        check("cross_entropy.row_max_abs_logit", rows[:, 0], row_max)
        check("cross_entropy.row_softmax_denominator", rows[:, 1], denom)
        check("cross_entropy.max_abs_logit", out["losses"][N + 1:N + 2], [row_max.max().item()])
        check("cross_entropy.min_softmax_denominator", out["losses"][N + 2:N + 3],
              [denom.min().item()])
        got[adapter] = out
    same_bits("cross_entropy", got)

