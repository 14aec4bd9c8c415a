"""14_room_move.wgsl (room_gpu.js's overlapped move, through the lab page on SwiftShader)
against numpy's f32 arithmetic: the moved weights are version + (weights - end), each `-` and
`+` correctly rounded in f32, bit for bit (what room_worker.js's CPU path and bench/room_torch.py
compute), and a mixed run's f16 mirror is numpy's float16 of them (round to nearest even)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.lab import b64, call, mirror_words


def problem(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A version, a round's end a round's steps from it and the weights a few steps on, over
    magnitudes where the f32 `-` and `+` round (and past f16's range, 1e-9 to 1e5)."""
    rng = np.random.default_rng(seed)
    version = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 5, n)).astype(np.float32)
    end = (version - rng.standard_normal(n) * 10.0 ** rng.integers(-9, 3, n)).astype(np.float32)
    weights = (end + rng.standard_normal(n) * 10.0 ** rng.integers(-9, 3, n)).astype(np.float32)
    weights[:64] = end[:64]                                  # no step since: the version itself
    return version, end, weights


@pytest.mark.parametrize("mirror", [False, True])
def test_the_gpu_move_is_numpys_f32_arithmetic_bit_for_bit(lab_session, mirror):
    for n, seed in [(256 * 40 + 77, 0), (5, 1)]:           # (odd: the mirror's half-word tail)
        version, end, weights = problem(n, seed)
        out = call(lab_session, "return await lab.roomMove(args);",
                   {"version": b64(version), "end": b64(end), "weights": b64(weights),
                    "mirror": mirror})
        want = version + (weights - end)                     # f32 throughout
        got = out["weights"][:n]
        diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert diff.size == 0, (diff[:5], got[diff[:5]], want[diff[:5]])
        assert np.array_equal(got[:64], version[:64])
        if mirror:
            assert np.array_equal(out["mirror"][:-(-n // 2)], mirror_words(want))
        else:
            assert out["mirror"] is None
