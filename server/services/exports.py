"""A run's exports: its metrics as pages of JSON or CSV text read from the store a page at a
time (a big run is never held whole), its weights as a safetensors stream (the final upload or
checkpoint `step`), and the whole Hugging Face checkpoint as a zip made on a thread of its own
as it is read (export.py zip_stream: nothing on disk, a few MiB held). What is not there (no
weights, no such checkpoint) is NOT_FOUND, what is damaged (a short weights file, a foreign
tokenizer, a checkpoint that fails its digest) BROKEN, both before the first byte. Who may
export how many at once, and the responses' headers, are the web layer's."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from andrea.errors import BROKEN, NOT_FOUND, Refused
from andrea.export import (
    ExportFile,
    export_files,
    safetensors_stream,
    tokenizer_path,
    zip_stream,
)
from andrea.metrics import COLUMNS, mlp_hist_labels
from andrea.run_config import run_layout
from andrea.store import Store

METRICS_PAGE = 2000         # records read (and sent) at a time: a big run is never held whole
TENSOR_NORM_COLUMN = "grad_norm:"   # + a tensor's name: the CSV column of its gradient norm
ZIP_CHUNK = 256 << 10       # bytes of the zip handed to the response at a time
ZIP_AHEAD = 4               # chunks the zip's thread may make before the reader takes them


async def record_pages(store: Store, run_id: str):
    """The run's committed records, METRICS_PAGE at a time, oldest first."""
    after = None
    while page := await store.run(store.metrics.page, run_id, after, METRICS_PAGE):
        yield page
        after = page[-1]["step"]


async def json_pages(store: Store, run_id: str) -> AsyncIterator[str]:
    """The records as one JSON array, a page of text at a time."""
    sep = "["
    async for page in record_pages(store, run_id):
        yield sep + json.dumps(page, ensure_ascii=False, allow_nan=False,
                               separators=(",", ":"))[1:-1]
        sep = ","
    yield "[]" if sep == "[" else "]"


def csv_list_columns(layout: dict) -> dict[str, list[str]]:
    """The CSV's columns for each list field of a record, in entry order (Record says what
    each list holds one entry for)."""
    params = layout["params"]
    layers = [f"layer {i}" for i in range(layout["config"]["n_layer"])]
    names = [p["name"] for p in params]
    return {
        "tensor_grad_norms": [TENSOR_NORM_COLUMN + n for n in names],
        "update_ratio": [f"update_ratio:{n}" for n in names],
        "resid_rms": [f"resid_rms:{p['name']}" for p in params if len(p["shape"]) == 1],
        "mlp_dead": [f"mlp_dead:{layer}" for layer in layers],
        "mlp_hist": [f"mlp_hist:{layer}:{b}" for layer in layers for b in mlp_hist_labels()],
    }


def csv_columns(lists: dict[str, list[str]]) -> list[str]:
    """The CSV's header: every numeric field, then each list's entries (csv_list_columns)."""
    return [*COLUMNS, *(c for cols in lists.values() for c in cols)]


def _flat(field: str, values: list) -> list:
    return [x for row in values for x in row] if field == "mlp_hist" else values


def csv_row(record: dict, lists: dict[str, list[str]]) -> dict:
    """A record as the CSV's columns: each list's entries under their own."""
    return {**record, **{c: v for field, cols in lists.items()
                         for c, v in zip(cols, _flat(field, record.get(field) or ()))}}


def csv_pages(store: Store, run: dict) -> AsyncIterator[str]:
    """The records as CSV text, the header first, a page at a time. The columns are worked out
    here, before the first page: a run whose layout cannot be made fails before a response
    starts."""
    lists = csv_list_columns(run_layout(run["config"]))
    return _csv_pages(store, run["id"], lists)


async def _csv_pages(store: Store, run_id: str, lists: dict[str, list[str]]):
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=csv_columns(lists), extrasaction="ignore")
    writer.writeheader()
    async for page in record_pages(store, run_id):
        writer.writerows(csv_row(r, lists) for r in page)
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    yield buf.getvalue()


def _refusal(e: Exception) -> Refused | None:
    """export.py's errors as refusals: nothing there (no weights uploaded, no such checkpoint),
    or damaged (weights of the wrong size, a foreign tokenizer, a checkpoint's digest)."""
    if isinstance(e, FileNotFoundError):
        return Refused(NOT_FOUND, str(e))
    if isinstance(e, ValueError):
        return Refused(BROKEN, str(e))
    return None


async def weights(run: dict, data_dir: Path, step: int | None = None
                  ) -> tuple[int, Iterator[bytes]]:
    """model.safetensors of the run's final upload, or of checkpoint `step`: (its size, its
    pieces, read from the weights file as they are taken)."""
    try:
        return await asyncio.to_thread(safetensors_stream, run, data_dir, step)
    except (FileNotFoundError, ValueError) as e:
        raise _refusal(e) from e


async def checkpoint_files(run: dict, store: Store, data_dir: Path, corpus_dir: Path,
                           step: int | None = None) -> list[ExportFile]:
    """The files of the run's Hugging Face checkpoint (export.py export_files), of checkpoint
    `step` or the final upload; without the run's tokenizer built yet, the weights, configs
    and card only, as a local export. Their bytes are made as they are read."""
    try:
        # The card's four facts by query, on a reader thread: no run is read whole.
        records = await store.run(store.metrics.card_summary, run["id"], step)
        # (On a thread: a task run's tokenizer is written the first time.)
        return await asyncio.to_thread(lambda: export_files(
            run, data_dir, tokenizer_path(corpus_dir, run), records, step, corpus_dir))
    except (FileNotFoundError, ValueError) as e:
        raise _refusal(e) from e


class _ReaderGone(Exception):
    """The export's reader went away: its zip's thread stops."""


class _ZipPipe:
    """The file the zip's thread writes (write() only: zipfile then needs no seek) and the
    chunks the response reads, at most ZIP_AHEAD in between: a slow reader holds the thread,
    not memory."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.chunks = loop, asyncio.Queue(ZIP_AHEAD)
        self.buf = bytearray()
        self.gone = threading.Event()

    def write(self, data) -> int:
        self.buf += data
        if len(self.buf) >= ZIP_CHUNK:
            view = memoryview(self.buf)
            whole = len(view) - len(view) % ZIP_CHUNK
            try:
                for at in range(0, whole, ZIP_CHUNK):
                    self.put(bytes(view[at:at + ZIP_CHUNK]))
            finally:
                view.release()
            del self.buf[:whole]
        return len(data)

    def flush(self) -> None:
        pass

    def put(self, item) -> None:
        """On the zip's thread: waits (for the reader) until the chunk is queued."""
        if self.gone.is_set():
            raise _ReaderGone()
        done = asyncio.run_coroutine_threadsafe(self.chunks.put(item), self.loop)
        while True:
            try:
                done.result(timeout=0.5)
                return
            except TimeoutError:
                if self.gone.is_set():
                    done.cancel()
                    raise _ReaderGone() from None


def _write_zip(files: list[ExportFile], pipe: _ZipPipe) -> None:
    try:
        zip_stream(files, pipe)
        if pipe.buf:
            pipe.put(bytes(pipe.buf))
        pipe.put(None)
    except _ReaderGone:
        pass
    except BaseException as e:      # (the response is under way: it is cut short)
        with contextlib.suppress(_ReaderGone, RuntimeError):
            pipe.put(e)
    finally:
        for f in files:
            f.pieces.close()        # the weights file closed, whatever happened


def zip_pieces(files: list[ExportFile], release: Callable[[], None]) -> AsyncIterator[bytes]:
    """The zip of `files`, its bytes as zip_stream makes them on a thread of its own (not a
    pool's: a slow reader holds it); `release` called when the reading ends or is cut, or when
    the pieces are dropped unread (a response that never started). `release` must be safe to
    call twice."""
    body = _zip_pieces(files, release)
    weakref.finalize(body, release)
    return body


async def _zip_pieces(files: list[ExportFile], release: Callable[[], None]):
    pipe = _ZipPipe(asyncio.get_running_loop())
    try:
        threading.Thread(target=_write_zip, args=(files, pipe), daemon=True,
                         name="andrea-export-zip").start()
        while (chunk := await pipe.chunks.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
    finally:
        pipe.gone.set()
        release()
