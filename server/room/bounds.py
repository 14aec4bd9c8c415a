"""How far one round of AdamW can move a weight: the bound the server holds a room worker's
pseudo-gradient (global minus its weights, rounds.py) to. A delta past it came from no honest run.

The engine's AdamW (12_optimizer.wgsl, torch.optim.AdamW's arithmetic): at step t, after n <= t
updates of its moments (n < t for a worker that joined late with fresh moments: t is the run's
step, optimizer_hyper.js; under loss scaling both count applied steps),
    m = (1-b1) sum_k b1^k g_k,  v = (1-b2) sum_k b2^k g_k^2   (k < n, g_0 the newest)
    w <- w (1 - lr wd) - lr u,  u = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).

Ratio (adam_ratio_bound). Cauchy-Schwarz, r = b1^2 / b2:
    |sum b1^k g_k| <= sqrt(sum r^k) sqrt(sum b2^k g_k^2),  so
    |u| <= f(n, t) = (1-b1)/sqrt(1-b2) * sqrt(S_n) * sqrt(1-b2^t) / (1-b1^t),  S_n = sum_{k<n} r^k.
S_n grows with n, so fresh moments (n < t) never beat n = t: B = max_{t <= steps} f(t, t), taken
numerically over every t (for r >= 1, S_n grows without bound and so does B with steps).
Equality holds at every step for gradients growing by b2/b1 a step (g_k ~ (b1/b2)^k): B is
reached. b1 = 0: B = sqrt((1-b2^steps)/(1-b2)); b2 = 0: v sees the newest gradient only, so
B = 1 if b1 = 0, else no bound (inf). Also |m| <= (1-b1^n) G <= (1-b1^t) G for gradients
|g| <= G (clipping at max_norm bounds every element by max_norm), so |u| <= G / eps.

8-bit (adam8_ratio_bound). m and v live as codes times a block absmax (server/optim.py). An
element whose v rounds to the zero code while its m does not then steps by m / eps on a zero
gradient, far past B (measured: tests/unit/test_room_bounds.py). The codes lie in [-1, 1], so by
induction |m_deq| <= absmax <= (1-b1^(n-1)) G, and v >= (1-b2) g^2. The ratio
(b1 |m_deq| + (1-b1) |g|) / (1-b1^t) / (sqrt((1-b2)/(1-b2^t)) |g| + eps) is monotone in |g| in
[0, G]: at g = 0 it is < b1 G / eps, at |g| = G at most 1/sqrt(1-b2). Hence
    |u_8bit| <= min(G / eps, max(b1 G / eps, 1 / sqrt(1 - b2))),
derived, not measured; unbounded without clipping.

Round (delta_bound). With a per-step ratio bound R, decoupled decay d_k = 1 - lr_k wd and w0 the
round's start (|w0| <= M on the decayed elements): w_H - w0 = (P - 1) w0 - sum_k lr_k
(prod_{j>k} d_j) u_k with P = prod d_k, and sum_k lr_k wd prod_{j>k} d_j = 1 - P (it
telescopes), so
    |w_H - w0| <= (1 - P) (M + R / wd),  reached by w0 = M, u_k = R, constant lr;
it grows with every lr_k, so lr_k = peak lr (config.lr) for all H steps bounds the schedule:
1 - P = 1 - (1 - lr wd)^H. Elements without decay (and wd = 0): H lr R. This is tighter than
H lr R + lr wd sum_t (M + t lr R) and never above it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from andrea.run_config import RunConfig

F32_U = 2.0 ** -24     # f32 unit roundoff (round to nearest)
F16_U = 2.0 ** -11     # f16 unit roundoff: the f16 codec moves a value by at most this part
F16_TINY = 2.0 ** -25  # half f16's smallest subnormal: the f16 codec's absolute rounding there
# Relative slack on the bound. The f16 codec rounds each value by at most F16_U (4.9e-4); the
# int8 codec decodes q * (absmax / 127) with |q| <= 127, within the block's absmax up to two
# f32 roundings (1.2e-7); the GPU's update u carries a few f32 roundings (m, v, sqrt, the
# division, the f32 bias corrections and lr: ~10 F32_U = 6e-7), and so does w0 - w_H. Twice the
# f16 rounding covers them all.
REL_SLACK = 2 * F16_U
# f32 roundings of w per step, each within F32_U |w|: the decay multiply, the f32 decay factor
# 1 - lr wd, and the add of the update. An absolute error (F32_U |w| H in all), not relative to
# the delta: it matters where lr is tiny beside |w|.
ROUNDINGS_PER_STEP = 3


@functools.lru_cache(maxsize=64)
def adam_ratio_bound(beta1: float, beta2: float, steps: int) -> float:
    """Upper bound B on |m_hat_t| / (sqrt(v_hat_t) + eps) over every step t <= steps, every
    gradient sequence and moments started fresh at any step (module docstring); inf if none."""
    b1, b2, steps = float(beta1), float(beta2), int(steps)
    if not (0 <= b1 < 1 and 0 <= b2 < 1) or steps < 1:
        raise ValueError(f"need 0 <= beta < 1 and steps >= 1 (beta1 {b1}, beta2 {b2}, "
                         f"steps {steps})")
    if b2 == 0:
        return 1.0 if b1 == 0 else math.inf
    t = np.arange(1, steps + 1, dtype=np.float64)
    log_bc2 = np.log(-np.expm1(t * math.log(b2)))              # log(1 - b2^t)
    if b1 == 0:
        log_s = np.zeros_like(t)
        log_bc1 = np.zeros_like(t)
    else:
        lr_ = 2 * math.log(b1) - math.log(b2)                   # log r
        if lr_ < 0:      # S_t = (1 - r^t) / (1 - r)
            log_s = np.log(-np.expm1(t * lr_)) - math.log(-math.expm1(lr_))
        elif lr_ == 0:
            log_s = np.log(t)
        else:            # S_t = r^t (1 - r^-t) / (r - 1), in logs: no overflow
            log_s = t * lr_ + np.log(-np.expm1(-t * lr_)) - math.log(math.expm1(lr_))
        log_bc1 = np.log(-np.expm1(t * math.log(b1)))          # log(1 - b1^t)
    log_f = (math.log1p(-b1) - 0.5 * math.log1p(-b2)
             + 0.5 * log_s + 0.5 * log_bc2 - log_bc1)
    top = float(log_f.max())
    return math.inf if top > 709 else math.exp(top)


def adam8_ratio_bound(beta1: float, beta2: float, eps: float, max_grad: float) -> float:
    """Upper bound on |update| / lr of the 8-bit optimizer's quantized-state elements (module
    docstring), with every gradient element within max_grad (inf: no clipping, no bound)."""
    if math.isinf(max_grad):
        return math.inf
    g_eps = max_grad / eps
    return min(g_eps, max(beta1 * g_eps, 1 / math.sqrt(1 - beta2)))


def step_ratio_bound(config: RunConfig) -> float:
    """The bound on |update| / lr of one AdamW step under a room run's config: B (capped at
    G / eps under clipping), or for adamw_8bit the larger of that (its f32-state tensors) and
    adam8_ratio_bound. inf where no bound exists."""
    b1, b2, eps = config.beta1, config.beta2, config.eps
    h = config.room.inner_steps
    horizon = -(-config.steps // h) * h       # the worker's steps (room_worker.js)
    clipped = config.clip_mode != "off"
    g_max = config.max_norm if clipped else math.inf   # |g_i| <= the clipped norm
    ratio = min(adam_ratio_bound(b1, b2, horizon), g_max / eps)
    if config.optimizer == "adamw_8bit":
        ratio = max(ratio, adam8_ratio_bound(b1, b2, eps, g_max))
    return ratio


def delta_bound(config: RunConfig, max_abs_decay: float, max_abs: float | None = None) -> float:
    """Bound on every element of |w0 - w_H| after one round (config.room.inner_steps = H
    steps at most config.lr each) of a room run, as the server decodes it from any codec.
    max_abs_decay: the largest |w0| over the decayed elements of the global weights; max_abs:
    the largest |w0| over all elements (norm gains too), for the f32 rounding of w (default
    max_abs_decay). inf where the config admits no bound (adamw_8bit without clipping)."""
    h = config.room.inner_steps
    lr, wd = float(config.lr), float(config.weight_decay)
    ratio = step_ratio_bound(config)
    if math.isinf(ratio):
        return math.inf
    m0 = float(max_abs_decay)
    drift = h * lr * ratio                                # no decay: H lr R
    if wd > 0:
        x = lr * wd
        one_minus_p = 1.0 if x >= 1 else -math.expm1(h * math.log1p(-x))
        drift = max(drift, one_minus_p * (m0 + ratio / wd))
    w_max = max(m0, float(max_abs) if max_abs is not None else m0) + h * lr * ratio
    rounding = ROUNDINGS_PER_STEP * h * F32_U * w_max
    return (drift + rounding) * (1 + REL_SLACK) + F16_TINY
