"""What the routes that write a run's files share (checkpoint, weights and room uploads): a body
streamed to disk at exactly its size, a file streamed out, and the run's folder when the run is
deleted meanwhile. A module of its own, so that no route imports another."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import HTTPException
from starlette.requests import Request

from andrea.checkpoints import READ_BYTES
from andrea.durable import TEMP_SUFFIX
from andrea.paths import run_dir
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


async def gone_meanwhile(store, data_dir, run_id: str, what: str) -> None:
    """404, the run's folder removed again (an upload that began after the delete made it
    anew), when the run was deleted while `what` was uploaded. Under the run's lock: a delete
    takes it too, so a run that is there now stays there until the upload is committed."""
    if await store.run(store.runs.get, run_id) is not None:
        return
    await asyncio.to_thread(shutil.rmtree, run_dir(data_dir, run_id), True)
    raise HTTPException(404, f"run {run_id} was deleted during the upload of its {what}; "
                             "nothing was stored")


def temp_file(folder: Path) -> Path:
    """An empty file of its own in `folder` (made first) for a body on its way in: two uploads
    at once never share one (a shared name let the second write into the file the first had
    already renamed into place). A crash's leftovers go at the next start
    (CheckpointStore.recover)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=folder, suffix=TEMP_SUFFIX)
    os.close(fd)
    return Path(name)
