"""The room's outer optimizer: SGD with Nesterov momentum on the averaged pseudo-gradient, as
DiLoCo (Douillard et al. 2023) and torch.optim.SGD(nesterov=True, momentum=mu, dampening=0,
weight_decay=0) compute it, in f32 and in place:

    buf = g                      at the first outer step (torch: a clone of the gradient)
    buf = mu * buf + g           after it
    w  -= lr * (g + mu * buf)

The pseudo-gradient is global weights minus a worker's weights, so lr 1 and mu 0 with one worker
moves the global weights onto that worker's."""

from __future__ import annotations

import math

import numpy as np


def nesterov_step(weights: np.ndarray, momentum: np.ndarray, grad: np.ndarray, lr: float,
                  mu: float, first: bool) -> None:
    """One outer step on f32 arrays of the same length: `weights` and `momentum` updated."""
    lr, mu = np.float32(lr), np.float32(mu)
    if first:
        momentum[...] = grad
    else:
        momentum *= mu
        momentum += grad
    step = grad + mu * momentum
    step *= lr
    weights -= step


def norm64(x: np.ndarray) -> float:
    """The L2 norm summed in float64, a slice at a time: finite for every finite f32 array (an
    f32 sum of squares overflows past ~1e19, and an infinite norm broke the round's close)."""
    total = 0.0
    for i in range(0, x.size, NORM_SLICE):
        part = x[i:i + NORM_SLICE].astype(np.float64)
        total += float(np.dot(part, part))
    return math.sqrt(total)


NORM_SLICE = 1 << 20
