"""Checkpoints on disk: a run's complete training state after step K (the sections of
optim.checkpoint_sections, concatenated), so a run outlives its tab.

  <data_dir>/runs/<run_id>/checkpoints/<K:09d>.ckpt   the sections, raw
  <data_dir>/runs/<run_id>/checkpoints/<K:09d>.json   the sidecar: step, optimizer, sections,
                                                      bytes, sha256, chunk_sha256, created_at

The sidecar is the commit marker. An upload streams into a temp file in the same folder,
checked chunk by chunk against the uploader's digests; then fsync, rename, fsync the folder,
and the sidecar is written the same way. A crash at any point leaves either the previous
checkpoints alone or the new one whole: a .ckpt without a sidecar (or a temp file) is garbage,
removed at the next commit and at start-up. Pruning deletes a sidecar before its .ckpt.

Everything here is blocking file I/O: callers run it in a thread (routes/checkpoints.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from andrea.durable import TEMP_SUFFIX, fsync_dir, write_atomic
from andrea.errors import BROKEN, DISK_FULL, MALFORMED, NOT_FOUND, Refused
from andrea.paths import checkpoints_dir, room_dir, run_dir, runs_dir

CHUNK_BYTES = 64 << 20       # uploads carry one SHA-256 per chunk of this size (the last shorter)
READ_BYTES = 1 << 20
# A full or read-only disk: the server answers 507 and keeps what it had.
DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM}
SHARED_TEMP_IDLE_S = 900     # an upload idle this long on another process is a dead one's


class CheckpointError(Refused):
    """An upload or a read refused: its kind (errors.Refusal) and why."""


def disk_error(e: OSError) -> CheckpointError | None:
    """DISK_FULL with the reason when the disk refused the write; None for other errors."""
    if e.errno not in DISK_ERRNOS:
        return None
    name = errno.errorcode.get(e.errno, str(e.errno))
    return CheckpointError(DISK_FULL, f"the server cannot store the checkpoint: {e.strerror or e}"
                                      f" ({name}); the previous checkpoints are kept")


def refusal_of(e: Exception) -> Refused | None:
    """The refusal a failed checkpoint write or read is (a full disk's too: the app's one
    handler answers it, web/errors.py); None: a real server error."""
    if isinstance(e, Refused):
        return e
    return disk_error(e) if isinstance(e, OSError) else None


def newest_usable(metas: list[dict], last_step: int | None) -> int | None:
    """The newest checkpoint step whose steps all have committed records (up to `last_step`),
    or None: a tab that dies right after uploading checkpoint K may not have sent record K yet,
    and a run must never go on with a hole in its steps. Resume and branch start from it."""
    return max((m["step"] for m in metas if m["step"] <= (last_step or 0)), default=None)


def ckpt_name(step: int) -> str:
    return f"{step:09d}.ckpt"


def sidecar_name(step: int) -> str:
    return f"{step:09d}.json"


def parse_digests(header: str | None, total: int, chunk_bytes: int) -> list[str]:
    """The X-Andrea-Chunk-SHA256 header: one lowercase hex SHA-256 per chunk."""
    n = max(1, -(-total // chunk_bytes))
    if not header:
        raise CheckpointError(MALFORMED, f"missing X-Andrea-Chunk-SHA256: {n} comma-separated "
                                         f"SHA-256 digests, one per {chunk_bytes}-byte chunk")
    digests = [d.strip() for d in header.split(",")]
    if len(digests) != n:
        raise CheckpointError(MALFORMED, f"X-Andrea-Chunk-SHA256 has {len(digests)} digests; a "
                                         f"{total}-byte checkpoint has {n} chunks of {chunk_bytes}"
                                         " bytes")
    for i, d in enumerate(digests):
        if len(d) != 64 or d.strip("0123456789abcdef"):
            raise CheckpointError(MALFORMED, f"digest {i} is not a lowercase hex SHA-256: "
                                             f"{d[:80]!r}")
    return digests


class Upload:
    """One checkpoint being received: a temp file in the run's folder, the running whole-file
    hash and the current chunk's hash, checked at each chunk boundary."""

    def __init__(self, folder: Path, step: int, expected: int, digests: list[str],
                 chunk_bytes: int):
        self.folder, self.step, self.expected = folder, step, expected
        self.digests, self.chunk_bytes = digests, chunk_bytes
        self.size = 0
        self.sha = hashlib.sha256()
        self._chunk = hashlib.sha256()
        self._in_chunk = 0
        self._chunks_done = 0
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=ckpt_name(step) + ".", suffix=TEMP_SUFFIX)
        self.path = Path(tmp)
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        """Append (the caller refused anything past `expected`); a chunk that ends here must
        match its digest."""
        view = memoryview(data)
        while view:
            take = min(len(view), self.chunk_bytes - self._in_chunk)
            part, view = view[:take], view[take:]
            self._chunk.update(part)
            self.sha.update(part)
            self._in_chunk += take
            if self._in_chunk == self.chunk_bytes:
                self._end_chunk()
        self._file.write(data)
        self.size += len(data)

    def _end_chunk(self) -> None:
        index = self._chunks_done
        got = self._chunk.hexdigest()
        if got != self.digests[index]:
            raise CheckpointError(MALFORMED, f"chunk {index} (bytes {index * self.chunk_bytes}.."
                                             f"{index * self.chunk_bytes + self._in_chunk}) has "
                                             f"SHA-256 {got}, the uploader sent "
                                             f"{self.digests[index]}: the upload was corrupted; "
                                             "nothing was stored")
        self._chunk = hashlib.sha256()
        self._in_chunk = 0
        self._chunks_done += 1

    def hash_written(self) -> None:
        """The digests of what was written at its offsets (CheckpointStore.write_filled): the
        file read back in order, its chunks' digests recorded, not checked."""
        self._file.flush()
        self.digests, self.size = [], 0
        self.sha, self._chunk, self._in_chunk, self._chunks_done = \
            hashlib.sha256(), hashlib.sha256(), 0, 0
        # The whole file's digest on a second thread, beside the chunks' (hashlib lets go of
        # the GIL over a block): a room's close waits on this, twice the model's f32 bytes.
        with open(self.path, "rb") as f, ThreadPoolExecutor(1) as whole:
            pending = None
            while block := f.read(READ_BYTES):
                if pending is not None:
                    pending.result()
                pending = whole.submit(self.sha.update, block)
                view = memoryview(block)
                while view:
                    take = min(len(view), self.chunk_bytes - self._in_chunk)
                    self._chunk.update(view[:take])
                    self._in_chunk += take
                    view = view[take:]
                    if self._in_chunk == self.chunk_bytes:
                        self._record_chunk()
                self.size += len(block)
            if pending is not None:
                pending.result()
        if self._in_chunk or not self.digests:
            self._record_chunk()

    def _record_chunk(self) -> None:
        self.digests.append(self._chunk.hexdigest())
        self._chunk, self._in_chunk = hashlib.sha256(), 0
        self._chunks_done += 1

    def finish(self) -> None:
        """The whole body is here: the last (short) chunk checked, the data on disk."""
        if self._in_chunk:
            self._end_chunk()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def discard(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass
        self.path.unlink(missing_ok=True)


def _recent(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < SHARED_TEMP_IDLE_S
    except FileNotFoundError:
        return False


class CheckpointStore:
    """The checkpoints of every run in one data dir. Commits and pruning of a run are
    serialized by the caller (Fanout.run_lock); `_active` names the temp files being written,
    so cleaning garbage never removes an upload in progress. `shared`: other server processes
    write to the same data dir (their uploads are not in `_active`), so a temp file is garbage
    only once nothing has written to it for SHARED_TEMP_IDLE_S. `kept`: the checkpoints a run
    keeps after each commit; None for a reader that never commits (export)."""

    def __init__(self, data_dir: Path, kept: int | None = None, shared: bool = False):
        self.data_dir, self.kept, self.shared = data_dir, kept, shared
        self._active: set[Path] = set()
        self._lock = threading.Lock()

    def folder(self, run_id: str) -> Path:
        return checkpoints_dir(self.data_dir, run_id)

    # ---- reading --------------------------------------------------------------------------
    def list(self, run_id: str) -> list[dict]:
        """The committed checkpoints (a sidecar and its .ckpt), oldest first."""
        folder = self.folder(run_id)
        try:
            names = set(os.listdir(folder))
        except FileNotFoundError:
            return []
        out = []
        for name in sorted(names):
            if not name.endswith(".json") or name[:-5] + ".ckpt" not in names:
                continue
            try:
                meta = json.loads((folder / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue          # unreadable: not committed
            out.append(meta)
        return sorted(out, key=lambda m: m["step"])

    def get(self, run_id: str, step: int) -> dict | None:
        folder = self.folder(run_id)
        if not (folder / ckpt_name(step)).exists():
            return None
        try:
            return json.loads((folder / sidecar_name(step)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def latest(self, run_id: str) -> dict | None:
        metas = self.list(run_id)
        return metas[-1] if metas else None

    def open_verified(self, run_id: str, step: int):
        """(meta, an open file at offset 0) after checking the whole file against the sidecar's
        sha256: a damaged file is never served. The open file survives a prune meanwhile."""
        meta = self.get(run_id, step)
        if meta is None:
            raise CheckpointError(NOT_FOUND, f"run {run_id} has no checkpoint at step {step}")
        f = open(self.folder(run_id) / ckpt_name(step), "rb")
        try:
            sha = hashlib.sha256()
            size = 0
            while block := f.read(READ_BYTES):
                sha.update(block)
                size += len(block)
            if size != meta["bytes"] or sha.hexdigest() != meta["sha256"]:
                raise CheckpointError(BROKEN, f"the checkpoint of step {step} is damaged on the "
                                              f"server: {size} bytes with SHA-256 "
                                              f"{sha.hexdigest()}, recorded {meta['bytes']} bytes "
                                              f"with {meta['sha256']}")
            f.seek(0)
            return meta, f
        except BaseException:
            f.close()
            raise

    def open_section(self, run_id: str, step: int, index: int = 0):
        """(its bytes, the verified file open at the start of section `index`)."""
        meta, f = self.open_verified(run_id, step)
        f.seek(sum(s["bytes"] for s in meta["sections"][:index]))
        return meta["sections"][index]["bytes"], f

    def read_section(self, run_id: str, step: int, index: int = 0) -> bytes:
        """One section's bytes (export takes W, section 0), after verifying the file."""
        size, f = self.open_section(run_id, step, index)
        with f:
            return f.read(size)

    # ---- writing --------------------------------------------------------------------------
    def begin(self, run_id: str, step: int, expected: int, digests: list[str],
              chunk_bytes: int) -> Upload:
        upload = Upload(self.folder(run_id), step, expected, digests, chunk_bytes)
        with self._lock:
            self._active.add(upload.path)
        return upload

    def write(self, run_id: str, step: int, parts: list[bytes], optimizer: str,
              sections: list[dict]) -> dict:
        """Checkpoint `step` from bytes the server made (a room's global version: room/rounds.py),
        through the same upload, digests and commit as a trainer's. The one before it is kept
        whatever `kept` says: a room's close that a stop cut short is redone from it."""
        chunk = CHUNK_BYTES
        whole = b"".join(parts) if len(parts) != 1 else parts[0]
        digests = [hashlib.sha256(whole[i:i + chunk]).hexdigest()
                   for i in range(0, max(len(whole), 1), chunk)]
        upload = self.begin(run_id, step, len(whole), digests, chunk)
        try:
            upload.write(whole)
            return self.commit(run_id, upload, optimizer, sections, kept=max(self.kept or 0, 2))
        finally:
            self.discard(upload)

    def write_filled(self, run_id: str, step: int, size: int, fill, optimizer: str,
                     sections: list[dict]) -> dict:
        """Checkpoint `step` of `size` bytes that `fill(f)` writes at their offsets into an open
        file (a room's close streams its sections a chunk at a time, never a whole copy in
        memory); then digested and committed as write() does. A fill that raises commits
        nothing."""
        upload = self.begin(run_id, step, size, [], CHUNK_BYTES)
        try:
            upload._file.truncate(size)
            fill(upload._file)
            upload.hash_written()
            if upload.size != size:
                raise ValueError(f"checkpoint {step}: {upload.size} bytes written, not {size}")
            return self.commit(run_id, upload, optimizer, sections, kept=max(self.kept or 0, 2))
        finally:
            self.discard(upload)

    def discard(self, upload: Upload) -> None:
        upload.discard()
        with self._lock:
            self._active.discard(upload.path)

    def commit(self, run_id: str, upload: Upload, optimizer: str,
               sections: list[dict], kept: int | None = None) -> dict:
        """The finished upload becomes checkpoint `upload.step`, then the run keeps only its
        newest `kept` (the store's by default). Returns the sidecar. The same step uploaded
        again with the same bytes is a no-op; with other bytes, the old one is uncommitted
        first."""
        folder, step = upload.folder, upload.step
        try:
            upload.finish()
            meta = {"step": step, "optimizer": optimizer, "sections": sections,
                    "bytes": upload.size, "sha256": upload.sha.hexdigest(),
                    "chunk_bytes": upload.chunk_bytes, "chunk_sha256": upload.digests,
                    "created_at": time.time()}
            old = self.get(run_id, step)
            if old is not None and old["sha256"] == meta["sha256"]:
                return old
            self._clean(folder)
            if old is not None:                    # uncommit before replacing the data
                (folder / sidecar_name(step)).unlink()
                fsync_dir(folder)
            os.replace(upload.path, folder / ckpt_name(step))
            fsync_dir(folder)
            write_atomic(folder / sidecar_name(step),
                          json.dumps(meta, indent=1).encode())
        finally:
            self.discard(upload)
        self.prune(run_id, kept)
        return meta

    def prune(self, run_id: str, kept: int | None = None) -> None:
        self._remove(run_id, [m["step"] for m in self.list(run_id)[:-(kept or self.kept)]])

    def discard_after(self, run_id: str, step: int) -> list[int]:
        """Removes the checkpoints after `step` (a resume from `step`: they belong to the
        timeline it abandons, whose records after `step` are gone; kept, they would take the
        kept slots and the run's checkpoint_step). Returns their steps."""
        later = [m["step"] for m in self.list(run_id) if m["step"] > step]
        self._remove(run_id, later)
        return later

    def _remove(self, run_id: str, steps: list[int]) -> None:
        folder = self.folder(run_id)
        for step in steps:
            (folder / sidecar_name(step)).unlink(missing_ok=True)   # uncommit first
            (folder / ckpt_name(step)).unlink(missing_ok=True)
        if steps:
            fsync_dir(folder)

    def link(self, src_run: str, step: int, dest_run: str) -> dict:
        """Checkpoint `step` of src_run becomes dest_run's (a branch): hard links where the
        file system allows, a copy elsewhere. Sidecar last, as in a commit."""
        meta = self.get(src_run, step)
        if meta is None:
            raise CheckpointError(NOT_FOUND, f"run {src_run} has no checkpoint at step {step}")
        src, dest = self.folder(src_run), self.folder(dest_run)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / ckpt_name(step)
        try:
            os.link(src / ckpt_name(step), target)
        except FileExistsError:
            raise
        except OSError:           # another file system, or links not allowed: copy
            tmp = dest / (ckpt_name(step) + TEMP_SUFFIX)
            shutil.copyfile(src / ckpt_name(step), tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target)
        fsync_dir(dest)
        write_atomic(dest / sidecar_name(step), json.dumps(meta, indent=1).encode())
        return meta

    def remove_run(self, run_id: str) -> None:
        """A branch whose database row could not be written leaves no files behind."""
        shutil.rmtree(run_dir(self.data_dir, run_id), ignore_errors=True)

    # ---- garbage --------------------------------------------------------------------------
    def _clean(self, folder: Path) -> None:
        """Temp files of no upload in progress, .ckpt files without a sidecar, and sidecars
        without a .ckpt."""
        try:
            names = set(os.listdir(folder))
        except FileNotFoundError:
            return
        with self._lock:
            active = {p.name for p in self._active}
        for name in names:
            stem = name.rsplit(".", 1)[0]
            # Another process's upload, or its commit between the .ckpt's rename and the
            # sidecar's, looks the same as a dead one's until it has been idle a while.
            theirs = self.shared and _recent(folder / name)
            garbage = ((name.endswith(TEMP_SUFFIX) and name not in active and not theirs)
                       or (name.endswith(".ckpt") and stem + ".json" not in names and not theirs)
                       or (name.endswith(".json") and stem + ".ckpt" not in names))
            if garbage:
                (folder / name).unlink(missing_ok=True)

    def recover(self) -> dict[str, int]:
        """At start-up: every run's garbage removed (uploads of no process, checkpoints without a
        sidecar); returns each run's newest checkpoint step (the database's checkpoint_step)."""
        newest = {}
        runs = runs_dir(self.data_dir)
        if not runs.is_dir():
            return newest
        for run in runs.iterdir():
            # Uploads a crash cut short beside the checkpoints: the weights' and a room's
            # bodies, a room state's rewrite (routes/run_files.temp_file, write_atomic).
            for folder in (run, room_dir(self.data_dir, run.name)):
                for tmp in folder.glob("*" + TEMP_SUFFIX):
                    if not (self.shared and _recent(tmp)):
                        tmp.unlink(missing_ok=True)
            folder = self.folder(run.name)
            if folder.is_dir():
                self._clean(folder)
                last = self.latest(run.name)
                if last is not None:
                    newest[run.name] = last["step"]
        return newest
