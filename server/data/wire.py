"""The batch body on the wire: a small little-endian header, row sources, then u32 tokens.

    offset  type           field
    0       4 bytes        magic b"ANDB"
    4       u32            version (1)
    8       u32            B, rows
    12      u32            T; each row holds T + 1 tokens (inputs = row[:T], targets = row[1:])
    16      u32            step (training step, or validation batch index)
    20      u32            split: 0 train, 1 validation
    24      u32            bytes per token (4: tokens are u32)
    28      u32            K, number of sources (names: GET /api/corpus, in this order)
    32      u32            bandit phase index of this step; 0xFFFFFFFF when not in bandit mode
    36      u32            tokens_offset: byte offset of the first token
    40      B x u8         source index of each row, zero-padded to a multiple of 4 bytes
    tokens_offset  B*(T+1) x u32   tokens, row-major

Every field is 4-byte aligned, so the browser reads the header with one Uint32Array and the
tokens with `new Uint32Array(body, tokens_offset, B * (T + 1))`, ready for a GPU upload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"ANDB"
VERSION = 1
HEADER = struct.Struct("<4s9I")     # 40 bytes
NO_PHASE = 0xFFFFFFFF
SPLITS = {"train": 0, "val": 1}
MEDIA_TYPE = "application/x-andrea-batch"


@dataclass(frozen=True)
class Batch:
    step: int
    split: str
    n_sources: int
    phase: int | None
    sources: np.ndarray             # (B,) uint8
    tokens: np.ndarray              # (B, T + 1) uint32


def tokens_offset(batch_size: int) -> int:
    return HEADER.size + -(-batch_size // 4) * 4


def encode(batch: Batch) -> bytes:
    B, rows = batch.tokens.shape
    offset = tokens_offset(B)
    head = HEADER.pack(MAGIC, VERSION, B, rows - 1, batch.step, SPLITS[batch.split], 4,
                       batch.n_sources, NO_PHASE if batch.phase is None else batch.phase, offset)
    pad = bytes(offset - HEADER.size - B)
    return b"".join((head, batch.sources.astype(np.uint8).tobytes(), pad,
                     batch.tokens.astype("<u4", copy=False).tobytes()))


def decode(body: bytes) -> Batch:
    """The inverse of encode: used by tests, the benchmark and a PyTorch-side replay."""
    if len(body) < HEADER.size:
        raise ValueError(f"batch body too short: {len(body)} bytes")
    magic, version, B, T, step, split, width, K, phase, offset = HEADER.unpack_from(body)
    if magic != MAGIC or version != VERSION or width != 4:
        raise ValueError(f"not an Andrea batch v{VERSION} (magic {magic!r}, version {version})")
    sources = np.frombuffer(body, np.uint8, B, HEADER.size)
    tokens = np.frombuffer(body, "<u4", B * (T + 1), offset).reshape(B, T + 1)
    return Batch(step, {v: k for k, v in SPLITS.items()}[split], K,
                 None if phase == NO_PHASE else phase, sources, tokens)
