"""The data dir's storage budget: one account of its disk that every writer goes through (made
once by create_app, handed out as deps.StorageDep), and what a step record takes in the store.

Free space is the data dir's file system's (shutil.disk_usage, read at most every REFRESH_S, off
the event loop) plus, for the store's rows, the free pages of the SQLite file (what deleted runs
left behind: SQLite reuses them before it grows the file); less what uploads in progress were
promised (reserve) and what was written since the last reading (take, Reservation.wrote). The
floor (Settings.min_free_bytes) stays free of all of it:

  - a checkpoint or weights upload reserves its exact size before its first byte is read: 507
    when free - reserved - size < floor, so uploads running at once cannot cross it together;
  - a new run: 507 when even its first step would cross the floor, or when the records its
    config will write (estimated_run_bytes) do not fit above it (a state of the server: free
    space, then try again); 422 when they are more than Settings.max_run_bytes (a property of
    the config: fewer steps or a smaller batch);
  - the trainer socket checks each metrics message, sample and status change before committing
    it (StorageFull): past the floor, or past its run's max_run_bytes (RunBytes), it closes the
    socket with protocol.STORAGE_BUDGET and a message that says so; nothing committed is lost
    and the tab keeps what was not acknowledged.

Deleting a run needs no budget and asks none: and since records stop at the floor, SQLite
always has room left for the delete's own journal (a full disk made it answer 503).

In-process, like quotas.py: with several processes on one data dir each counts its own
reservations (the disk reading is shared). With PostgreSQL (database_url) records are not in
the data dir: the floor is not theirs, max_run_bytes still is."""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from andrea.errors import DISK_FULL, Refused
from andrea.metrics import COLUMNS

log = logging.getLogger("andrea.storage")

REFRESH_S = 0.5     # the longest a disk reading is used before it is read again
# The kinds of StorageFull: the first word of the trainer socket's close reason.
FLOOR = "disk_floor"        # the data dir is at its free-space floor (ANDREA_MIN_FREE_BYTES)
RUN_BYTES = "run_bytes"     # the run has stored its max_run_bytes (ANDREA_MAX_RUN_BYTES)


def mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists (a data dir not made yet)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


# A client that tries again after a full disk's 507 waits this long (Retry-After): a page's
# weights upload is hundreds of MB each try (the trainer socket waits 30 s too: telemetry.js).
FULL_RETRY_S = 30


class DiskFull(Refused):
    """An upload or a new run the budget refused (DISK_FULL: 507), and when to try again."""

    def __init__(self, message: str, retry_after_s: int | None = None):
        super().__init__(DISK_FULL, message, retry_after_s)


class StorageFull(Exception):
    """A write the budget refused: its `kind` (FLOOR, RUN_BYTES) and why; str() starts with
    the kind."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class Reservation:
    """Bytes promised to one upload: what it writes moves from promised to written."""

    def __init__(self, budget: StorageBudget, nbytes: int):
        self.budget, self.left = budget, nbytes

    def wrote(self, n: int) -> None:
        n = min(n, self.left)
        self.left -= n
        self.budget.reserved -= n
        self.budget.spent += n

    def release(self) -> None:
        """What was not written is no longer promised (again: nothing)."""
        self.budget.reserved -= self.left
        self.left = 0


class StorageBudget:
    """The data dir's free space above its floor, for every writer (the module's docstring).
    `free_pages`: an async function, the store's reusable bytes (SQLite's free pages);
    `records_here`: records are stored in the data dir (SQLite, not PostgreSQL). `disk_free`
    and `clock` are for tests."""

    def __init__(self, data_dir: Path, floor: int, *,
                 free_pages: Callable[[], Awaitable[int]] | None = None,
                 records_here: bool = True, refresh_s: float = REFRESH_S,
                 disk_free: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.data_dir, self.floor = data_dir, floor
        self.free_pages, self.records_here = free_pages, records_here
        self.refresh_s, self.clock = refresh_s, clock
        self.disk_free = disk_free or (lambda: shutil.disk_usage(_existing(data_dir)).free)
        self.disk = self.pages = 0      # the last reading: the disk's free bytes, the store's
        self.at = -math.inf             # when it was read (clock)
        self.reserved = 0               # promised to uploads in progress
        self.spent = 0                  # written (or about to be) since the last reading
        self._reading: asyncio.Future | None = None

    async def refresh(self, force: bool = False) -> None:
        """A new reading when the last one is older than refresh_s (one at a time: callers
        meanwhile wait for the same one)."""
        if not force and self.clock() - self.at < self.refresh_s:
            return
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
        await asyncio.shield(self._reading)

    async def _read(self) -> None:
        spent = self.spent      # written before this reading: in it from now on
        try:
            disk = await asyncio.to_thread(self.disk_free)
            pages = 0
            if self.free_pages is not None:
                try:
                    pages = int(await self.free_pages())
                except Exception:   # (a store out of reach: its free pages are not counted)
                    log.warning("reading the store's free pages failed", exc_info=True)
            self.disk, self.pages, self.at = disk, pages, self.clock()
            self.spent = max(0, self.spent - spent)
        finally:
            self._reading = None

    async def _fits(self, nbytes: float, rows: bool) -> bool:
        """Whether `nbytes` fit above the floor; before a refusal the disk is read again (a
        delete may have freed space since the last reading)."""
        await self.refresh()
        if self._free(rows) - nbytes >= self.floor:
            return True
        await self.refresh(force=True)
        return self._free(rows) - nbytes >= self.floor

    def _free(self, rows: bool) -> int:
        """Free bytes now: the disk's (and for rows, the store's free pages), less the
        promised and the written since the reading."""
        return self.disk + (self.pages if rows else 0) - self.reserved - self.spent

    def _state(self, rows: bool) -> str:
        promised = f", {mib(self.reserved)} of it promised to uploads in progress" \
            if self.reserved else ""
        pages = f" (and {mib(self.pages)} of free pages in its database)" \
            if rows and self.pages else ""
        return (f"the data dir {self.data_dir} has {mib(self.disk - self.spent)} free{pages}"
                f"{promised} and keeps at least {mib(self.floor)} (ANDREA_MIN_FREE_BYTES)")

    async def take(self, nbytes: float, what: str) -> None:
        """`nbytes` of rows (records, a sample, a status change; as stored) counted as written,
        or StorageFull(FLOOR), nothing counted, when they would cross the floor."""
        if not self.records_here:
            return
        if not await self._fits(nbytes, True):
            raise StorageFull(FLOOR, f"the server's storage budget is used up: {what} "
                                     f"(~{mib(nbytes)}) was not stored: {self._state(True)}")
        self.spent += math.ceil(nbytes)

    async def check_run(self, estimate: int, how: str) -> None:
        """507 when a new run's records, about `estimate` bytes (`how`: the figure's words),
        do not fit above the floor (with its records elsewhere: when the data dir is below
        the floor already)."""
        need = estimate if self.records_here else 0
        if await self._fits(need, self.records_here):
            return
        records = f" whose records would take about {mib(estimate)} ({how})" if need else ""
        raise DiskFull(f"not enough disk space for a new run{records}: "
                       f"{self._state(self.records_here)}: the server's storage budget; free "
                       "space or delete runs you no longer need (or ask for fewer steps), then "
                       "try again. Nothing was stored")

    async def reserve(self, nbytes: int, what: str) -> Reservation:
        """`nbytes` promised to an upload until it releases them (tell it what was written:
        Reservation.wrote), or 507 before anything is read when they would cross the floor.
        The check and the promise are one step on the event loop: uploads at once cannot
        both pass."""
        if not await self._fits(nbytes, False):
            raise DiskFull(f"not enough disk space for {what} of {mib(nbytes)}: "
                           f"{self._state(False)}: the server's storage budget; free space or "
                           "delete runs you no longer need, then try again. Nothing was stored",
                           FULL_RETRY_S)
        self.reserved += nbytes
        return Reservation(self, nbytes)


class RunBytes:
    """The bytes one run's records take in the store (as estimated: row_bytes), read from the
    store when its trainer connects (stored_run_bytes) and counted per message since, against
    Settings.max_run_bytes."""

    def __init__(self, stored: float, limit: int):
        self.stored, self.limit = stored, limit

    def check(self, nbytes: float, what: str) -> None:
        if self.stored + nbytes > self.limit:
            raise StorageFull(RUN_BYTES, f"this run's storage budget is used up: its records "
                                         f"take about {mib(self.stored)} of the {mib(self.limit)}"
                                         f" a run may store (ANDREA_MAX_RUN_BYTES), and {what} "
                                         f"(~{mib(nbytes)}) was not stored")

    def add(self, nbytes: float) -> None:
        self.stored += nbytes


# ---- what a step record takes in the store ----------------------------------------------------
# Measured once in SQLite (bench/record_bytes.py: the store's real rows, 1000 of each shape,
# the file's used pages after a checkpoint), in bytes per record: on the wire (compact JSON, 7
# significant digits as the engine sends; two source losses) and stored:
#   batch  tensors   wire  stored         batch  tensors   wire  stored
#       0        0    292     246            88        0   1073    4710
#       8        0    362     324           256        0   2566    4710
#       8       20    601     618  (tiny)   512        0   4842    8806
#      64        0    860    1065          1024        0   9393   12902
#      80        0   1002    1065             8      578   7291    8806
#    1024      578  16321   21094
# A row (a cell of a WITHOUT ROWID b-tree, 4 KiB pages: SQLite's default, the store's) keeps up
# to _MAX_LOCAL bytes in its leaf page; a bigger one keeps _MIN_LOCAL.. of them there and the
# rest in whole overflow pages: a record just over ~1 KB takes 4.7 KB. So a message's UTF-8
# length is no upper bound of what it stores (up to 4.4x less); row_bytes follows SQLite's rule
# (0.90-1.07x of the table above; tests/api/test_storage.py holds it to the store).
PAGE_BYTES = 4096
_MAX_LOCAL = (PAGE_BYTES - 12) * 64 // 255 - 23     # 1001
_MIN_LOCAL = (PAGE_BYTES - 12) * 32 // 255 - 23     # 489
_LEAF_SLACK = 1.15      # a leaf page's cell pointers, headers and the room left in it
ROW_NUMBERS = 170       # a row's bytes besides its JSON `extra`: key, header, numeric columns
ROW_KEY = 20            # a row's bytes beyond its wire JSON's: run id, header, less the braces
# The wire bytes of a numeric field beyond the 8 bytes of its column: its quoted name and colon,
# about (its number's text is about as long as the column), by name; what the engine sends.
NUMBER_NAMES = {name: len(name) + 2 for name in COLUMNS}
ENGINE_NUMBERS = sum(NUMBER_NAMES[n] for n in (
    "step", "loss", "grad_norm", "clip_scale", "lr", "tokens_per_s", "step_ms", "opt_ms",
    "grad_nonfinite", "logit_max", "softmax_denom_min"))
# A record's wire bytes (the engine's: server/metrics.py Record, static/js/engine/step_record.js):
# its fixed fields, and per row loss, per tensor (grad norm; non-finite count), per source loss.
WIRE_BASE, WIRE_PER_ROW, WIRE_PER_TENSOR, WIRE_PER_SOURCE = 320, 9, 12.5, 26


def row_bytes(payload: float) -> float:
    """The bytes a row of `payload` bytes takes in SQLite's pages (the rule above)."""
    if payload <= _MAX_LOCAL:
        return _LEAF_SLACK * payload
    local = _MIN_LOCAL + (payload - _MIN_LOCAL) % (PAGE_BYTES - 4)
    if local > _MAX_LOCAL:
        local = _MIN_LOCAL
    return _LEAF_SLACK * local + PAGE_BYTES * math.ceil((payload - local) / (PAGE_BYTES - 4))


def payload_of_wire(wire: float, elements: int, numbers: int = ENGINE_NUMBERS) -> float:
    """A record's row bytes from its wire bytes, its lists' elements (and twice its source
    losses), and the wire bytes its numeric fields' names take (`numbers`: NUMBER_NAMES of
    those sent): numbers become 8-byte columns, the lists stay JSON with a space after each
    comma (fitted to the table above)."""
    return max(wire + elements + ROW_KEY - numbers, ROW_NUMBERS)


def _full_record(batch_size: int, n_tensors: int, n_sources: int) -> tuple[float, int]:
    sources = min(n_sources, batch_size)
    return (WIRE_BASE + WIRE_PER_ROW * batch_size + WIRE_PER_TENSOR * n_tensors
            + WIRE_PER_SOURCE * sources), batch_size + n_tensors + 2 * sources


def estimated_run_bytes(steps: int, batch_size: int, n_tensors: int, n_sources: int) -> int:
    """What a run's records will take in the store: `steps` full records as the engine sends
    them (per-row losses, per-tensor grad norms, a loss per source in the batch)."""
    return math.ceil(steps * row_bytes(payload_of_wire(
        *_full_record(batch_size, n_tensors, n_sources))))


def message_bytes(records: list, wire: int) -> float:
    """What a metrics message of `wire` UTF-8 bytes will take in the store: its bytes shared
    among its records by their lists' lengths, each record's row by row_bytes."""
    shapes = [(len(r.row_losses or ()), len(r.tensor_grad_norms or ())
               + len(r.tensor_nonfinite or ()), len(r.source_losses or ()),
               sum(NUMBER_NAMES.get(f, 0) for f in r.model_fields_set)) for r in records]
    weights = [WIRE_BASE + WIRE_PER_ROW * rows + WIRE_PER_TENSOR * tensors
               + WIRE_PER_SOURCE * sources for rows, tensors, sources, _ in shapes]
    scale = wire / sum(weights) if weights else 0.0
    return sum(row_bytes(payload_of_wire(w * scale, rows + tensors + 2 * sources, numbers))
               for w, (rows, tensors, sources, numbers) in zip(weights, shapes))


def stored_run_bytes(rows: int, extra_bytes: float) -> float:
    """A stored run's records, about: `rows` of them with `extra_bytes` of JSON each (the store's
    Metrics.usage: a sample of its newest)."""
    return rows * row_bytes(ROW_NUMBERS + extra_bytes)
