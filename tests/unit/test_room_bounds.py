"""server/room/bounds.py: the per-element bound on a room worker's pseudo-gradient holds against
torch.optim.AdamW (CPU, f32) on adversarial gradient sequences, and is nearly reached; the 8-bit
optimizer's holds against a numpy emulation of its kernel (12_optimizer.wgsl's arithmetic, as
tests/unit/gpu/test_optimizer.py emulate_8bit) and against bitsandbytes' AdamW8bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from andrea.optim import create_dynamic_map
from andrea.room.bounds import (
    adam8_ratio_bound,
    adam_ratio_bound,
    delta_bound,
    step_ratio_bound,
)
from andrea.run_config import RunConfig

H, T0 = 25, 200          # inner steps; steps before the measured round
M, GAIN = 0.1, 1.0       # |w0| of the decayed elements, and of the others (norm gains)
f32 = np.float32


def config(b1=0.9, b2=0.95, lr=3e-3, wd=0.1, eps=1e-8, **kw) -> RunConfig:
    return RunConfig(**{"preset": "tiny", "lr": lr, "weight_decay": wd, "beta1": b1, "beta2": b2,
                        "eps": eps, "max_norm": 1.0, "clip_mode": "global", "optimizer": "adamw",
                        "steps": T0 + H, "warmup_steps": 20, "min_lr_ratio": 0.1,
                        "room": {"inner_steps": H}, **kw})


def lr_at(step, c):
    """static/js/engine/schedule.js lrAt."""
    if step < c.warmup_steps:
        return c.lr * (step + 1) / c.warmup_steps
    t = min(1, (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps))
    floor = c.min_lr_ratio
    return c.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def greedy(b1, b2, steps):
    """Each step the gradient that maximises |m| / sqrt(v) after it: for m' = b1 m + (1-b1) g,
    v' = b2 v + (1-b2) g^2 the argmax is g = (1-b1) b2 v / (b1 (1-b2) m)."""
    g, m, v, out = 1.0, 0.0, 0.0, []
    for _ in range(steps):
        out.append(g)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        g = (1 - b1) * b2 * v / (b1 * (1 - b2) * m)
    return np.array(out)


def scenarios(b1, b2, seed=0):
    """Gradient sequences [T0 + H, N], every element within max_norm 1 (clipping's bound), and
    each negated too."""
    rng = np.random.default_rng(seed)
    T = T0 + H
    j = np.arange(T)[:, None]
    cols = [np.ones((T, 1))]                                           # constant sign
    for k in (0, 1, 3, 10, 40):                                        # a spike, then tiny
        cols.append(np.where(j == T0 - k, 1.0, 1e-6))
        cols.append(np.where(j < T0 - k, 1.0, 0.0))                    # ones, then zeros
    for k in (1, 5, 12):
        cols.append(np.where(j == T0 + k, 1.0, 1e-7))
    cols.append(np.where(j % 2 == 0, 1.0, 1e-6))                       # alternating huge/tiny
    cols.append(np.where(j % 2 == 1, 1.0, 1e-6))
    cols.append(np.where(j % 2 == 0, 1.0, -1e-3))
    for p in (3, 7, 20, 60):                                           # sparse
        for o in range(0, p, max(1, p // 3)):
            cols.append(np.where(j % p == o, 1.0, 0.0))
    cols.append(np.clip(rng.standard_normal((T, 16)) * 0.3, -1, 1))    # random
    mag = np.exp(rng.uniform(-14, 0, (T, 16)))
    cols.append(mag * rng.choice([-1.0, 1.0], (T, 16)))
    if b1 > 0 and b2 > 0:
        q = (b2 / b1) ** (j - T + 1.0) if b2 > b1 else (b2 / b1) ** j.astype(float)
        cols.append(q)                         # Cauchy-Schwarz equality: grows by b2/b1 a step
        cols.append(np.where(j < T0 + 5, q, 0.0))
        gr = greedy(b1, b2, T)[:, None]
        cols.append(gr / np.abs(gr).max())
    g = np.concatenate(cols, axis=1)
    return np.concatenate([g, -g], axis=1)


def adamw_round(g, c, lrs, fresh_at=None):
    """torch.optim.AdamW: T0 steps of history (lr 0: the moments only), or fresh moments at step
    `fresh_at`; then w0 set (decayed M, others GAIN) and H steps at lrs. -> (|delta| decayed,
    |delta| others, max per-step |update| / lr, measured on undecayed weights from 0 where f32
    rounds finely)."""
    n = g.shape[1]
    dec, nod, zero = (torch.nn.Parameter(torch.zeros(n)) for _ in range(3))
    opt = torch.optim.AdamW([{"params": [dec], "weight_decay": c.weight_decay},
                             {"params": [nod, zero], "weight_decay": 0.0}], lr=0.0,
                            betas=(c.beta1, c.beta2), eps=c.eps, foreach=False)
    grads = torch.from_numpy(g.astype(f32))
    if fresh_at is None:
        for s in range(T0):
            dec.grad, nod.grad, zero.grad = (grads[s].clone() for _ in range(3))
            opt.step()
    else:
        for p in (dec, nod, zero):
            opt.state[p] = {"step": torch.tensor(float(fresh_at)),
                            "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}
    with torch.no_grad():
        dec.fill_(M)
        nod.fill_(GAIN)
        zero.fill_(0.0)
    w0d, w0n = dec.detach().clone(), nod.detach().clone()
    ratio = 0.0
    for k in range(H):
        for group in opt.param_groups:
            group["lr"] = lrs[k]
        before = zero.detach().clone()
        dec.grad, nod.grad, zero.grad = (grads[T0 + k].clone() for _ in range(3))
        opt.step()
        ratio = max(ratio, float((zero.detach() - before).abs().max()) / lrs[k])
    return ((w0d - dec.detach()).abs().double().numpy(),
            (w0n - nod.detach()).abs().double().numpy(), ratio)


PAIRS = [(0.9, 0.95, 1e-8), (0.9, 0.999, 1e-8), (0.0, 0.99, 1e-8), (0.95, 0.9, 1e-8),
         (0.5, 0.0, 1e-3)]   # b1^2 > b2 for (0.95, 0.9); b2 = 0: only clipping bounds it (G/eps)


@pytest.mark.parametrize("b1,b2,eps", PAIRS)
def test_delta_bound_holds_against_torch_adamw(b1, b2, eps):
    c = config(b1, b2, eps=eps)
    bound = delta_bound(c, M, max_abs=GAIN)
    assert math.isfinite(bound)
    g = scenarios(b1, b2)
    peak = [c.lr] * H
    sched = [lr_at(T0 + k, c) for k in range(H)]
    first = [lr_at(k, c) for k in range(H)]
    worst = 0.0
    for lrs, fresh in ((peak, None), (sched, None), (peak, T0), (first, 0)):
        d_dec, d_nod, ratio = adamw_round(g, c, lrs, fresh)
        worst = max(worst, d_dec.max(), d_nod.max())
        assert ratio <= step_ratio_bound(c) * (1 + 1e-4), (lrs[0], fresh, ratio)
    print(f"betas {b1}/{b2}: worst |delta| {worst:.6g} of bound {bound:.6g} "
          f"({worst / bound:.4f})")
    assert worst <= bound


def test_bound_is_nearly_reached_at_the_defaults():
    """Defaults (0.9/0.95, lr 3e-3, wd 0.1, H 25, |w0| 0.1): gradients growing by b2/b1 a step
    reach B at every step, so the worst case comes within a fraction of a percent."""
    c = config()
    b = adam_ratio_bound(0.9, 0.95, T0 + H)
    assert b == pytest.approx(1.164959, abs=1e-6)
    bound = delta_bound(c, M, max_abs=GAIN)
    # (1 - (1 - lr wd)^H) (M + B / wd), and never above the brief's cruder form.
    exact = -math.expm1(H * math.log1p(-3e-4)) * (M + b / 0.1)
    crude = H * 3e-3 * b + 3e-4 * sum(M + t * 3e-3 * b for t in range(H))
    assert exact <= bound <= exact * 1.002 and bound < crude
    d_dec, d_nod, ratio = adamw_round(scenarios(0.9, 0.95), c, [c.lr] * H)
    tight = d_dec.max() / bound
    print(f"defaults: B {b:.6f}, bound {bound:.6g}, worst decayed {d_dec.max():.6g} ({tight:.4f}),"
          f" no decay {d_nod.max():.6g} (H lr B {H * 3e-3 * b:.6g}), step ratio {ratio:.6f}")
    assert tight >= 0.99
    assert ratio >= 0.999 * b


def test_ratio_bound_edges():
    assert adam_ratio_bound(0.0, 0.0, 10) == 1.0                        # sign descent
    assert adam_ratio_bound(0.5, 0.0, 10) == math.inf
    assert adam_ratio_bound(0.0, 0.99, 1) == pytest.approx(1.0)
    assert adam_ratio_bound(0.0, 0.99, 10**6) == pytest.approx(10.0)     # 1 / sqrt(1 - b2)
    assert adam_ratio_bound(0.9, 0.95, 1) == pytest.approx(1.0)          # t = 1: |u| = 1
    # b1^2 >= b2: grows with steps, up to no bound at all.
    assert adam_ratio_bound(0.95, 0.9, 100) < adam_ratio_bound(0.95, 0.9, 1000)
    assert adam_ratio_bound(0.9, 0.81, 400) == pytest.approx(
        0.1 / math.sqrt(0.19) * math.sqrt(400) * math.sqrt(1 - 0.81**400) / (1 - 0.9**400))
    assert adam_ratio_bound(0.9, 0.8, 10**6) == math.inf
    # The closed form of the sum against a direct one.
    b1, b2, t = 0.9, 0.999, 300
    s = sum((b1 * b1 / b2) ** k for k in range(t))
    direct = (1 - b1) / math.sqrt(1 - b2) * math.sqrt(s) * math.sqrt(1 - b2**t) / (1 - b1**t)
    assert adam_ratio_bound(b1, b2, t) >= direct * (1 - 1e-12)
    c = config(wd=0.0)
    assert delta_bound(c, 5.0) == pytest.approx(H * 3e-3 * adam_ratio_bound(0.9, 0.95, T0 + H),
                                                rel=2e-3)
    assert delta_bound(config(b1=0.5, b2=0.0, clip_mode="off"), M) == math.inf
    assert delta_bound(config(optimizer="adamw_8bit", clip_mode="off"), M) == math.inf
    # RunConfig's defaults for the rest
    assert delta_bound(RunConfig(preset="tiny", lr=1e-3, room={"inner_steps": 10}), M) > 0


# ---- 8-bit --------------------------------------------------------------------------------

QM, QV = np.array(create_dynamic_map(True), f32), np.array(create_dynamic_map(False), f32)


def _nearest(x, code):
    i = np.clip(np.searchsorted(code, x, side="right") - 1, 0, 255)
    j = np.minimum(i + 1, 255)
    return np.where((i < 255) & (np.abs(x - code[j]) < np.abs(x - code[i])), j, i)


def _quant(x, code, sign_fix):
    am = np.abs(x).max(axis=1).astype(f32)
    inv = np.where(am > 0, f32(1) / np.where(am > 0, am, f32(1)), f32(0)).astype(f32)
    nx = (x * inv[:, None]).astype(f32)
    k = _nearest(nx, code)
    if sign_fix:
        k = np.where((nx < 0) & (code[k] >= 0), k - 1, k)
    return k, am


def adamw8_round(g, c, history):
    """The 8-bit kernel's arithmetic on blocks g [steps, blocks, 256] (all decayed): `history`
    steps at lr 0, then w0 = M and the rest at c.lr. -> (|delta| [blocks, 256], max per-step
    |update| / lr)."""
    b1, b2, eps, lr, wd = c.beta1, c.beta2, c.eps, c.lr, c.weight_decay
    cm = np.zeros(g.shape[1:], np.int64)
    cv = np.zeros(g.shape[1:], np.int64)
    am = av = np.zeros(g.shape[1], f32)
    w = np.full(g.shape[1:], M, f32)
    ratio = 0.0
    for s in range(g.shape[0]):
        t, lr_s = s + 1, (0.0 if s < history else lr)
        gs = g[s].astype(f32)
        m, v = QM[cm] * am[:, None], QV[cv] * av[:, None]
        m = (gs.astype(np.float64) * f32(1 - b1) + (m * f32(b1))).astype(f32)   # fma
        v = (v * f32(b2) + (f32(1 - b2) * gs) * gs).astype(f32)
        c1, c2 = 1 - b1**t, math.sqrt(1 - b2**t)
        u = (f32(1 / c1) * m) / (np.sqrt(v) / f32(c2) + f32(eps))
        if s >= history:
            ratio = max(ratio, float(np.abs(u).max()))
            w = (w * f32(1 - lr_s * wd)).astype(f32)
            w = (w + (f32(-lr_s / c1) * m) / (np.sqrt(v) / f32(c2) + f32(eps))).astype(f32)
        cm, am = _quant(m, QM, True)
        cv, av = _quant(v, QV, False)
    return np.abs(f32(M) - w).astype(np.float64), ratio


def blocks8(b1, b2, steps, history, seed=0):
    """Adversarial blocks: element 0 drives the block's absmax (constant, alternating, random
    sign, or arriving late); the others are probes of magnitudes 1e-6..3e-2 (growing by b2/b1 a
    step, constant, or random sign) that stop (gradient 0) around the round's start, so that
    their v rounds to the zero code while their m does not."""
    rng = np.random.default_rng(seed)
    nb = 48
    j = np.arange(steps)[:, None, None]
    g = np.zeros((steps, nb, 256))
    kind = np.arange(nb) % 4
    big = np.stack([np.ones(steps), np.where(np.arange(steps) % 2 == 0, 1.0, -1.0),
                    rng.choice([-1.0, 1.0], steps),
                    (np.arange(steps) >= history - 3).astype(float)], axis=1)
    g[:, :, 0] = big[:, kind]
    a = 10.0 ** rng.uniform(-6, -1.5, (nb, 255))
    off = history + rng.integers(-8, 8, (nb, 255))
    pattern = rng.integers(0, 3, (nb, 255))
    on = j < off[None]
    probe = np.where(on, a[None], 0.0)
    probe = np.where(pattern[None] == 0, probe * (b2 / b1) ** np.minimum(j - off[None], 0), probe)
    probe = np.where((pattern[None] == 2) & on, probe * rng.choice([-1.0, 1.0], probe.shape),
                     probe)
    g[:, :, 1:] = probe
    return g


def test_8bit_bound_holds_and_is_needed():
    c = config(optimizer="adamw_8bit", steps=120)
    history = 120 - H
    g = blocks8(0.9, 0.95, 120, history)
    delta, ratio = adamw8_round(g, c, history)
    bound = delta_bound(c, M)
    r8 = adam8_ratio_bound(0.9, 0.95, 1e-8, 1.0)
    b = adam_ratio_bound(0.9, 0.95, 120)
    print(f"8-bit: worst step {ratio:.4g} lr = {ratio / r8:.3g} of the derived {r8:.4g} "
          f"(B {b:.4f}); worst |delta| {delta.max():.4g} = {delta.max() / bound:.3g} of "
          f"{bound:.4g}")
    assert delta.max() <= bound
    assert ratio <= r8
    assert ratio > 1000 * b          # far past B: v's zero code under a nonzero m


def test_8bit_bound_holds_against_bitsandbytes():
    bnb = pytest.importorskip("bitsandbytes")
    c = config(optimizer="adamw_8bit", steps=80)
    history = 80 - H
    g = blocks8(0.9, 0.95, 80, history, seed=1)[:, :16].reshape(80, 4096)   # >= min_8bit_size
    p = torch.nn.Parameter(torch.zeros(4096))
    opt = bnb.optim.AdamW8bit([p], lr=0.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    grads = torch.from_numpy(g.astype(f32))
    for s in range(80):
        if s == history:
            with torch.no_grad():
                p.fill_(M)
            for group in opt.param_groups:
                group["lr"] = c.lr
        p.grad = grads[s].clone()
        opt.step()
    assert opt.state[p]["state1"].dtype == torch.uint8
    delta = (torch.tensor(M) - p.detach()).abs().max().item()
    print(f"bitsandbytes AdamW8bit: worst |delta| {delta:.4g} of {delta_bound(c, M):.4g}")
    assert delta <= delta_bound(c, M)
