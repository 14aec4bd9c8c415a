"""One `andrea serve` per data dir, unless they share a store on purpose.

Two servers on one SQLite data dir each think they are its only process: each shows the other's
live runs as "no training tab" with a Resume button (a trainer socket is known only to the
process that holds it), and each drops, at its start, the branches the other is still copying.
So a server that shares no store (no ANDREA_BROKER_URL, no ANDREA_DATABASE_URL) holds an
exclusive lock on `<data dir>/serve.lock` while it runs (flock: the kernel frees it when the
process dies, however it dies), with its pid and URL in the file. A second one is refused with
the first one's URL; `andrea train` without --server trains on that one instead of starting its
own (holder)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

try:
    import fcntl
except ImportError:      # (not POSIX: no lock, as before)
    fcntl = None

LOCK_NAME = "serve.lock"


class DataDirBusy(RuntimeError):
    """Another server holds the data dir; `holder` is what it wrote ({pid, url}), if readable."""

    def __init__(self, data_dir: Path, holder: dict | None):
        self.holder = holder
        who = (f"andrea serve (pid {holder.get('pid')}) at {holder.get('url')}" if holder
               else "another andrea serve")
        super().__init__(f"{who} is already serving the data dir {data_dir}: open that one, "
                         "or give this one its own --data-dir (processes share one data dir "
                         "only through ANDREA_BROKER_URL)")


def hold(data_dir: Path, url: str):
    """Takes the data dir's lock for this process (the returned file keeps it: keep a reference
    for as long as the server runs). Raises DataDirBusy when another process holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    f = open(path, "a+")        # noqa: SIM115 (held open for the process's life)
    if fcntl is None:
        return f
    for attempt in range(5):    # (a moment's shared lock is holder() looking, not a server)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 4:
                f.close()
                raise DataDirBusy(data_dir, holder(data_dir)) from None
            time.sleep(0.05)
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "url": url}))
    f.flush()
    return f


def holder(data_dir: Path) -> dict | None:
    """{pid, url} of the live server holding `data_dir`, or None (none, or it died: a lock
    file that nothing holds is stale)."""
    path = Path(data_dir) / LOCK_NAME
    if fcntl is None or not path.exists():
        return None
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(f.read() or "null")
            except json.JSONDecodeError:       # (being written this instant)
                return {}
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
