"""Files written so that a stop or a machine's crash leaves the old bytes or the new, never
half: fsync_dir, write_atomic (checkpoints, a room's state), and JSON-lines logs whose torn
last line costs only itself (a room's rounds and reports)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".part"     # a file on its way in: removed at start if no process writes it


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def append_line(path: Path, record: dict) -> None:
    """`record` as one JSON line at the end of `path`, synced. A line a crash left torn (the
    machine's, mid-write) is ended first, so this one stands on a line of its own."""
    with open(path, "ab+") as f:        # writes append wherever the position is
        size = f.seek(0, os.SEEK_END)
        torn = False
        if size:
            f.seek(size - 1)
            torn = f.read(1) != b"\n"
        f.write((b"\n" if torn else b"") + json.dumps(record).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_lines(path: Path) -> list[dict]:
    """A JSON-lines file's records; a line a crash left torn is skipped (append_line started
    the next one on a line of its own)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:          # torn (bad JSON or cut UTF-8), or the empty last piece
            continue
    return out
