"""What the routes that write a run's files share (checkpoint, weights and room uploads): a body
streamed to disk at exactly its size and a file streamed out (a run deleted meanwhile is
services/runs.gone_meanwhile's). A module of its own, so that no route imports another."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.requests import Request

from andrea.checkpoints import READ_BYTES
from andrea.durable import TEMP_SUFFIX
from andrea.storage import Reservation

FLUSH_BYTES = 4 << 20      # body bytes gathered before one write in a worker thread


async def receive_exactly(request: Request, expected: int, write: Callable[[bytes], object],
                          held: Reservation, refuse: Callable[[int, bool], None]) -> None:
    """The request's body through `write`, called in a worker thread a few MiB at a time (each
    told to `held`, the body's reservation in the storage budget), never held whole.
    `refuse(size, more)` raises for a body that is not exactly `expected` bytes: as soon as it
    gets past them (more: the body goes on), or at its end."""
    size, pending = 0, bytearray()
    async for piece in request.stream():
        size += len(piece)
        if size > expected:
            refuse(size, True)
        pending += piece
        if len(pending) >= FLUSH_BYTES:
            buf, pending = pending, bytearray()
            await asyncio.to_thread(write, buf)
            held.wrote(len(buf))
    if pending:
        await asyncio.to_thread(write, pending)
        held.wrote(len(pending))
    if size != expected:
        refuse(size, False)


async def stream_file(f, size: int | None = None) -> AsyncIterator[bytes]:
    """An open file's bytes from where it stands (`size` of them, or to its end), read in
    worker threads a MiB at a time, never held whole; the file is closed at the end."""
    left = size if size is not None else float("inf")
    try:
        while left > 0 and (block := await asyncio.to_thread(f.read, int(min(READ_BYTES, left)))):
            left -= len(block)
            yield block
    finally:
        f.close()


def temp_file(folder: Path) -> Path:
    """An empty file of its own in `folder` (made first) for a body on its way in: two uploads
    at once never share one (a shared name let the second write into the file the first had
    already renamed into place). A crash's leftovers go at the next start
    (CheckpointStore.recover)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=folder, suffix=TEMP_SUFFIX)
    os.close(fd)
    return Path(name)
