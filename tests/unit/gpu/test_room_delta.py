"""13_room_delta.wgsl (room_gpu.js, through the lab page on SwiftShader) against the
server's int8 encoder (server/room/codec.py encode, numpy): the GPU's body is the server's,
but where WGSL's division (within 2.5 ulp, numpy's is exact) may move a scale by its last bits
and a code by one where the quotient is that near a tie; every such difference is checked to
be one of those, and the server decodes the body to the same pseudo-gradient within a code."""

from __future__ import annotations

import numpy as np

from andrea.room import codec
from tests.lab import b64, call

BLOCK = 256


def gpu_body(page, version: np.ndarray, weights: np.ndarray) -> bytes:
    out = call(page, "return await lab.roomDeltaInt8(args);",
               {"version": b64(version), "weights": b64(weights)})
    return out["body"].view(np.uint8)[:int(out["bytes"])].tobytes()


def split(body: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    blocks = -(-n // BLOCK)
    return (np.frombuffer(body[:4 * blocks], "<f4"),
            np.frombuffer(body[4 * blocks:], np.int8).astype(np.int32))


def problem(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A version and weights a round apart, over magnitudes from 1e-6 to 1e2, with a block of
    equal values (scale 0), one whose differences sit on code ties, and a short last block."""
    rng = np.random.default_rng(seed)
    version = (rng.standard_normal(n) * 0.05).astype(np.float32)
    step = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 3, n)
    weights = (version - step).astype(np.float32)
    weights[BLOCK:2 * BLOCK] = version[BLOCK:2 * BLOCK]
    tie = slice(2 * BLOCK, 3 * BLOCK)                     # differences k + 0.5 of scale 1
    version[tie] = 0
    weights[tie] = -(np.arange(BLOCK) % 254 - 126.5).astype(np.float32)
    weights[2 * BLOCK] = -127
    return version, weights


def test_the_gpu_int8_delta_is_the_servers_but_for_division_ties(lab_session):
    for n, seed in [(BLOCK * 40 + 77, 0), (BLOCK * 3, 1)]:
        version, weights = problem(n, seed)
        got = gpu_body(lab_session, version, weights)
        delta = version - weights                          # f32, as WGSL's correctly rounded -
        want = codec.encode(delta, "int8")
        assert len(got) == len(want) == codec.payload_bytes("int8", n)
        g_scales, g_codes = split(got, n)
        w_scales, w_codes = split(want, n)
        ulps = np.abs(g_scales.view(np.int32) - w_scales.view(np.int32))
        assert ulps.max() <= 3, ulps.max()
        # A code may differ (by one) only where numpy's quotient is within 3 ulp of a tie.
        scale = np.repeat(np.where(w_scales > 0, w_scales, 1), BLOCK)[:n].astype(np.float64)
        q = delta.astype(np.float64) / scale
        near_tie = np.abs(np.abs(q - np.floor(q)) - 0.5) <= 4 * np.spacing(np.abs(q).astype(
            np.float32)).astype(np.float64)
        off = g_codes != w_codes
        assert np.all(np.abs(g_codes - w_codes) <= 1)
        moved = np.repeat(ulps > 0, BLOCK)[:n]
        assert np.all(near_tie[off] | moved[off]), np.flatnonzero(off & ~near_tie & ~moved)[:10]
        print(f"n {n}: {int(off.sum())} codes and {int((ulps > 0).sum())} scales differ")
        # The ties in the tie block round half to even, as numpy's rint does.
        assert np.array_equal(g_codes[2 * BLOCK:3 * BLOCK], w_codes[2 * BLOCK:3 * BLOCK])
        assert np.all(g_codes[BLOCK:2 * BLOCK] == 0) and g_scales[1] == 0
        # What the server takes from it: the same pseudo-gradient within a code of its block.
        back = codec.decode(got, "int8", n)
        assert np.all(np.abs(back - delta) <= np.repeat(w_scales, BLOCK)[:n] * 0.5 * (1 + 1e-5)
                      + np.repeat(w_scales, BLOCK)[:n] * off)
