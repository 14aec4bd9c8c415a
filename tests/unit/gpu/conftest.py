"""Fixtures shared by the optimizer tests (test_optimizer.py, test_loss_scale.py)."""

from __future__ import annotations

import numpy as np
import pytest

from andrea.model import PRESETS, build_layout
from andrea.optim import optimizer_memory

SCALES = [1.0, 0.3, 3.0, 0.1, 1.0, 2.0, 0.05, 1.0, 0.5, 1.0]   # grad norm ~1.1 * scale


@pytest.fixture(scope="module")
def layout():
    """As GET /api/presets/tiny/layout sends it: with optimizer_state, whose adamw_8bit.f32_tensors
    (server/optim.py) is what the engine keeps in f32: the norm gains and, by default, the
    embedding (tied output head)."""
    table = {"preset": "tiny", **build_layout(PRESETS["tiny"])}
    return {**table, "optimizer_state": optimizer_memory(table)}


@pytest.fixture(scope="module")
def problem(layout):
    """Initial weights (zero padding) and ten gradients, each Float32 [total_numel]."""
    rng = np.random.default_rng(0)
    n = layout["total_numel"]
    w0 = np.zeros(n, np.float32)
    grads = [np.zeros(n, np.float32) for _ in SCALES]
    for p in layout["params"]:
        sl = slice(p["offset"], p["offset"] + p["numel"])
        noise = rng.standard_normal(p["numel"])
        w0[sl] = noise * 0.02 if p["decay"] else 1 + 0.1 * noise
        for g, s in zip(grads, SCALES):
            g[sl] = rng.standard_normal(p["numel"]) * 3e-3 * s
    return w0, grads
