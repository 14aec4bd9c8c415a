"""How a room worker's pseudo-gradient travels: raw little-endian bytes of the run's flat
parameter buffer ([total_numel], the layout's order and padding), in one of three codecs.

  f32    numel x f32
  f16    numel x f16 (IEEE half, round to nearest even; values past 65504 become inf and are
         refused, as any non-finite value is)
  int8   block-wise absmax: the f32 scale of each block of BLOCK elements (absmax / 127), then
         numel x int8 codes q = round(x / scale), so x ~ q * scale. 1.016 bytes per element:
         ~4x less than f32, as INTELLECT-1 sends its pseudo-gradients.

decode() is the server's gate: a body of the wrong size, or one whose values are not all finite,
raises DeltaRefused with what was wrong; nothing else is checked here (norms and clipping are
the round's, rounds.py). The browser's encoder is static/js/engine/room_codec.js."""

from __future__ import annotations

import os

import numpy as np

CODECS = ("int8", "f16", "f32")
BLOCK = 256           # int8: elements per absmax scale (bitsandbytes' block size)
INT8_MAX = 127


class DeltaRefused(ValueError):
    """A pseudo-gradient the server will not add: wrong size or not finite."""


def payload_bytes(codec: str, numel: int) -> int:
    """The exact body size of a pseudo-gradient of `numel` elements."""
    if codec == "f32":
        return 4 * numel
    if codec == "f16":
        return 2 * numel
    if codec == "int8":
        return 4 * _blocks(numel) + numel
    raise ValueError(f"unknown codec {codec!r}; known: {', '.join(CODECS)}")


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def encode(delta: np.ndarray, codec: str) -> bytes:
    """The body for `delta` (f32 [numel]); the reference for the browser's encoder."""
    x = np.ascontiguousarray(delta, dtype=np.float32)
    if codec == "f32":
        return x.astype("<f4").tobytes()
    if codec == "f16":
        with np.errstate(over="ignore"):       # past f16's range: inf, which decode refuses
            return x.astype("<f2").tobytes()
    if codec == "int8":
        blocks = _padded(x).reshape(-1, BLOCK)
        scale = (np.abs(blocks).max(axis=1) / INT8_MAX).astype(np.float32)
        safe = np.where(scale > 0, scale, 1).astype(np.float32)
        with np.errstate(invalid="ignore"):    # a NaN's block: its scale is NaN, refused
            q = np.clip(np.rint(blocks / safe[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
        return scale.astype("<f4").tobytes() + q.reshape(-1)[: x.size].tobytes()
    raise ValueError(f"unknown codec {codec!r}; known: {', '.join(CODECS)}")


def _padded(x: np.ndarray) -> np.ndarray:
    pad = _blocks(x.size) * BLOCK - x.size
    return np.concatenate([x, np.zeros(pad, np.float32)]) if pad else x


def decode(body: bytes, codec: str, numel: int) -> np.ndarray:
    """f32 [numel] from a body; DeltaRefused for a wrong size or a value that is not finite."""
    want = payload_bytes(codec, numel)
    if len(body) != want:
        raise DeltaRefused(f"a {codec} pseudo-gradient of this model is {want} bytes "
                           f"({numel} elements), not {len(body)}")
    if codec == "f32":
        x = np.frombuffer(body, "<f4").astype(np.float32)
    elif codec == "f16":
        x = np.frombuffer(body, "<f2").astype(np.float32)
    else:
        scale = np.frombuffer(body, "<f4", count=_blocks(numel))
        if not np.isfinite(scale).all() or (scale < 0).any():
            raise DeltaRefused("an int8 block scale is negative or not finite")
        x = int8_values(body, numel)
    bad = np.count_nonzero(~np.isfinite(x))
    if bad:
        raise DeltaRefused(f"{bad} of the pseudo-gradient's {numel} values are not finite")
    return x


def int8_values(body: bytes, numel: int) -> np.ndarray:
    """f32 [numel] of an int8 body of the right size, unchecked: q * scale, one f32 product
    each (what the browser's decoder computes too, static/js/engine/room_codec.js)."""
    nb = _blocks(numel)
    scale = np.frombuffer(body, "<f4", count=nb).astype(np.float32)
    q = np.frombuffer(body, np.int8, offset=4 * nb)
    return (_padded(q.astype(np.float32)).reshape(nb, BLOCK) * scale[:, None]).reshape(-1)[:numel]


CHUNK = 1 << 20       # elements a streamed read decodes at once (a multiple of BLOCK)


def read_range(f, codec: str, numel: int, start: int, stop: int) -> np.ndarray:
    """f32 [stop - start] of the body in the open file `f` (its size checked by the caller):
    elements start..stop, `start` a multiple of BLOCK. Not checked for finite values: chunks()
    does that for a body taken in; a body stored was checked when it was taken."""
    n = stop - start
    if codec == "f32":
        f.seek(4 * start)
        return np.frombuffer(f.read(4 * n), "<f4").astype(np.float32)
    if codec == "f16":
        f.seek(2 * start)
        return np.frombuffer(f.read(2 * n), "<f2").astype(np.float32)
    b0, b1 = start // BLOCK, _blocks(stop)
    f.seek(4 * b0)
    scale = np.frombuffer(f.read(4 * (b1 - b0)), "<f4").astype(np.float32)
    f.seek(4 * _blocks(numel) + start)
    q = np.frombuffer(f.read(n), np.int8).astype(np.float32)
    return (_padded(q).reshape(-1, BLOCK) * scale[:, None]).reshape(-1)[:n]


def chunks(path, codec: str, numel: int, chunk: int = CHUNK):
    """(start, f32 chunk) over a body on disk, CHUNK elements at a time (memory: one chunk,
    whatever the model's size); DeltaRefused for a wrong size or a value that is not finite,
    as decode()."""
    want = payload_bytes(codec, numel)
    size = os.path.getsize(path)
    if size != want:
        raise DeltaRefused(f"a {codec} pseudo-gradient of this model is {want} bytes "
                           f"({numel} elements), not {size}")
    with open(path, "rb") as f:
        if codec == "int8":
            scale = np.frombuffer(f.read(4 * _blocks(numel)), "<f4")
            if not np.isfinite(scale).all() or (scale < 0).any():
                raise DeltaRefused("an int8 block scale is negative or not finite")
        for start in range(0, numel, chunk):
            x = read_range(f, codec, numel, start, min(numel, start + chunk))
            bad = np.count_nonzero(~np.isfinite(x))
            if bad:
                raise DeltaRefused(f"values of the pseudo-gradient are not finite ({bad} in "
                                   f"elements {start}..{start + x.size})")
            yield start, x
