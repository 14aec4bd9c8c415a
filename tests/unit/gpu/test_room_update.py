"""15_room_update.wgsl (room_gpu.js applyUpdate, through the lab page on SwiftShader) against the
server: an int8 room's version v comes as an update of v - 1 (server/room/codec.py's int8 body),
and the worker's GPU must land on the server's version bit for bit (its next pseudo-gradient is
taken from it): v = v - 1 + f32(code * scale), the product rounded before the sum, as
codec.decode and the sum in numpy do it; a mixed run's f16 mirror is numpy's float16 of v."""

from __future__ import annotations

import numpy as np
import pytest

from andrea.room import codec
from tests.lab import b64, call, mirror_words

BLOCK = 256


def problem(n: int, seed: int) -> tuple[np.ndarray, bytes]:
    """A held version over magnitudes from 1e-9 to 1e4 and an update over as many (a block of
    zeros, scale 0, among them), as the server encodes it."""
    rng = np.random.default_rng(seed)
    held = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 5, n)).astype(np.float32)
    step = (rng.standard_normal(n) * 10.0 ** np.repeat(rng.integers(-9, 2, -(-n // BLOCK)),
                                                         BLOCK)[:n]).astype(np.float32)
    step[:BLOCK] = 0
    return held, codec.encode(step, "int8")


@pytest.mark.parametrize("mirror", [False, True])
def test_the_gpu_update_lands_on_the_servers_version_bit_for_bit(lab_session, mirror):
    for n, seed in [(BLOCK * 40 + 77, 0), (5, 1)]:        # (odd: the mirror's half-word tail)
        held, body = problem(n, seed)
        words = np.frombuffer(body + bytes(-len(body) % 4), np.uint32)
        out = call(lab_session, "return await lab.roomUpdate(args);",
                   {"held": b64(held), "body": b64(words), "bytes": len(body), "mirror": mirror})
        want = held + codec.decode(body, "int8", n)       # f32 throughout
        for name in ("weights", "version"):
            got = out[name][:n]
            diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
            assert diff.size == 0, (name, diff[:5], got[diff[:5]], want[diff[:5]])
        if mirror:
            assert np.array_equal(out["mirror"][:-(-n // 2)], mirror_words(want))
        else:
            assert out["mirror"] is None
