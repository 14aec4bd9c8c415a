"""A room run's version 0 is made here, by the server, from the run's seed: the engine's GPU init
(shaders/00_init.wgsl as model.js `init(seed)` runs it) ported to numpy, so it has the same
tensors and scales as a lone run's first step and no worker uploads anything for it.

Every step is the shader's, in f32 (the PCG hash in wrapping u32), except log and cos: taken in
float64 and rounded, so correctly rounded on every machine alike. A GPU's own are looser (WGSL
allows cos 2^-11 absolute): tests/unit/test_room_init.py holds the two together within that.
"""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 20          # elements per step: temporaries stay a few tens of MB at any size

_U32 = np.uint32
_TWO_PI = np.float32(6.283185307179586)     # the shader's literal, as f32
_INV_2_24 = np.float32(1.0 / 16777216.0)     # the shader's 16777217.0 is 2^24 as f32 (a tie: even)


def _pcg(v: np.ndarray) -> np.ndarray:
    """00_init.wgsl's pcg on a uint32 array (array ops wrap silently; scalars would warn)."""
    state = v * _U32(747796405) + _U32(2891336453)
    word = ((state >> ((state >> _U32(28)) + _U32(4))) ^ state) * _U32(277803737)
    return (word >> _U32(22)) ^ word


def _normal(key: np.ndarray, start: int, stop: int, std: np.float32) -> np.ndarray:
    """Elements [start, stop) of one tensor's normal init, f32."""
    e2 = np.arange(start, stop, dtype=_U32) * _U32(2)      # 2e, wrapping as u32 does
    r1 = _pcg(key ^ _pcg(e2))
    e2 += _U32(1)
    r2 = _pcg(key ^ _pcg(e2))
    u1 = ((r1 >> _U32(8)).astype(np.float32) + np.float32(1)) * _INV_2_24   # exact
    u2 = (r2 >> _U32(8)).astype(np.float32) * _INV_2_24                     # exact
    radius = np.sqrt(np.float32(-2) * np.log(u1.astype(np.float64)).astype(np.float32))
    cos = np.cos((_TWO_PI * u2).astype(np.float64)).astype(np.float32)
    return (std * radius) * cos


def seeded_weights(layout: dict, seed: int) -> np.ndarray:
    """W as the engine's `model.init(seed)` leaves it for `layout` (andrea.run_config.run_layout):
    f32 [total_numel], each tensor at its offset, zeros in the alignment padding. `seed` is the
    run config's (trainer.js passes config.seed; the kernel takes it as u32)."""
    out = np.zeros(layout["total_numel"], np.float32)
    for stream, p in enumerate(layout["params"]):
        lo, n = p["offset"], p["numel"]
        if p["init"] == "ones":
            out[lo:lo + n] = 1.0
            continue
        key = _pcg(_U32(seed & 0xFFFFFFFF) ^ _pcg(np.array([stream], _U32)))
        std = np.float32(p["init_std"])
        for start in range(0, n, CHUNK):
            stop = min(n, start + CHUNK)
            out[lo + start:lo + stop] = _normal(key, start, stop, std)
    return out
