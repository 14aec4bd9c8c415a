"""Exports of a run: its metrics (JSON or CSV, streamed in pages from the store) and its weights
(a Hugging Face safetensors file streamed from the final upload or a checkpoint, or the whole
checkpoint folder as one zip, made as it is sent: nothing on disk). Reads, open to all: the
dashboard's download links; zips at most Settings.max_exports_per_client at once per address."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import threading
import weakref
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse

from andrea.export import (
    export_files,
    safetensors_stream,
    tokenizer_path,
    zip_size,
    zip_stream,
)
from andrea.metrics import COLUMNS, StoredRecord, mlp_hist_labels
from andrea.run_config import run_layout
from andrea.web.deps import RunDep, SettingsDep, StoreDep, get_existing_run
from andrea.web.quotas import ClientSlots, app_state

router = APIRouter(prefix="/api", tags=["runs"])

METRICS_PAGE = 2000         # records read (and sent) at a time: a big run is never held whole
TENSOR_NORM_COLUMN = "grad_norm:"   # + a tensor's name: the CSV column of its gradient norm

@router.get("/runs/{run_id}/metrics", response_model=list[StoredRecord],
            responses={200: {"content": {"text/csv": {}}}})
async def get_metrics(run: RunDep, store: StoreDep,
                      format: Annotated[Literal["json", "csv"], Query()] = "json") -> Response:
    """Every committed step record, oldest first: JSON (fields a step did not report are
    left out) or CSV (one column per numeric field of the record, then the lists, a column per
    entry: `grad_norm:<tensor>` and `update_ratio:<tensor>` per parameter tensor of the run's
    layout, `resid_rms:<norm gain>` per RMSNorm, `mlp_dead:layer <i>` and `mlp_hist:layer
    <i>:<bin>` per layer; empty where a step did not send it: the inside is an eval step's).
    `time` is when the server committed the row (Unix seconds)."""
    run_id = run["id"]
    if format == "json":
        return StreamingResponse(_json_pages(store, run_id), media_type="application/json",
                                 headers={"content-disposition":
                                          f'inline; filename="andrea-{run_id}.json"'})
    lists = csv_list_columns(run_layout(run["config"]))
    return StreamingResponse(_csv_pages(store, run_id, lists), media_type="text/csv", headers={
        "content-disposition": f'attachment; filename="andrea-{run_id}.csv"'})


async def record_pages(store, run_id: str):
    """The run's committed records, METRICS_PAGE at a time, oldest first."""
    after = None
    while page := await store.run(store.metrics.page, run_id, after, METRICS_PAGE):
        yield page
        after = page[-1]["step"]


async def _json_pages(store, run_id: str):
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


def _flat(field: str, values: list) -> list:
    return [x for row in values for x in row] if field == "mlp_hist" else values


async def _csv_pages(store, run_id: str, lists: dict[str, list[str]]):
    buf = io.StringIO()
    fields = [*COLUMNS, *(c for cols in lists.values() for c in cols)]
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    async for page in record_pages(store, run_id):
        writer.writerows({**r, **{c: v for field, cols in lists.items()
                                  for c, v in zip(cols, _flat(field, r.get(field) or ()))}}
                         for r in page)
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    yield buf.getvalue()


# ?step=K: the weights of checkpoint K instead of the final upload.
CheckpointStep = Annotated[int | None, Query(ge=1, description="a checkpoint's step")]


@router.get("/runs/{run_id}/model.safetensors")
async def get_model(run: RunDep, settings: SettingsDep, step: CheckpointStep = None):
    """The run's trained weights as a Hugging Face safetensors file (HF names, [out, in]),
    streamed from the weights file piece by piece: a download held open keeps no copy on disk
    and no more than a piece in memory."""
    run_id = run["id"]
    try:
        size, pieces = await asyncio.to_thread(safetensors_stream, run, settings.data_dir, step)
    except (FileNotFoundError, ValueError) as e:   # nothing uploaded; a damaged checkpoint
        raise HTTPException(404 if isinstance(e, FileNotFoundError) else 500, str(e)) from e
    name = f"andrea-{run_id}" + (f"-step{step}" if step else "")
    return StreamingResponse(pieces, media_type="application/octet-stream", headers={
        "content-length": str(size),
        "content-disposition": f'attachment; filename="{name}.safetensors"'})


@router.get("/runs/{run_id}/export.zip")
async def get_export(run_id: str, store: StoreDep, settings: SettingsDep, request: Request,
                     step: CheckpointStep = None):
    """The whole Hugging Face checkpoint (`andrea export` writes the same files) as one zip;
    `andrea export --server` unpacks it. Without the run's tokenizer built yet, the zip holds
    the weights, configs and card only, as a local export does. The zip is made as it is sent
    (export.zip_stream, on a thread of its own, a few pieces ahead of the reader): nothing is
    written to disk, no more than a few MiB held. At most max_exports_per_client at once per
    client address (429 with Retry-After past it), counted before the run is even read."""
    client = request.client.host if request.client else ""
    slots = app_state(request.app, "export_slots",
                      lambda: ClientSlots(settings.max_exports_per_client))
    release = slots.take(client)
    if release is None:
        raise HTTPException(429, f"too many exports at once from {client}: "
                                 f"{settings.max_exports_per_client} at a time "
                                 "(ANDREA_MAX_EXPORTS_PER_CLIENT); try again once one has "
                                 "finished", headers={"Retry-After": str(EXPORT_RETRY_S)})
    try:
        run = await get_existing_run(run_id, store)
        # The card's four facts by query, on a reader thread: no run is read whole.
        records = await store.run(store.metrics.card_summary, run_id, step)
        # (On the thread too: a task run's tokenizer is written the first time.)
        files = await asyncio.to_thread(lambda: export_files(
            run, settings.data_dir, tokenizer_path(settings.corpus_dir, run), records, step,
            settings.corpus_dir))
    except Exception as e:
        release()
        if isinstance(e, FileNotFoundError):   # no weights uploaded yet, no such checkpoint
            raise HTTPException(404, str(e)) from e
        if isinstance(e, ValueError):          # weights of the wrong size, a foreign tokenizer,
                                               # a damaged checkpoint
            raise HTTPException(500, str(e)) from e
        raise
    except BaseException:
        release()
        raise
    name = f"andrea-{run_id}" + (f"-step{step}" if step else "")
    headers = {"content-disposition": f'attachment; filename="{name}.zip"'}
    if (size := zip_size(files)) is not None:
        headers["content-length"] = str(size)
    body = _zip_pieces(files, release)
    weakref.finalize(body, release)     # a response never started: its slot comes back too
    return StreamingResponse(body, media_type="application/zip", headers=headers)


EXPORT_RETRY_S = 5          # Retry-After of an export refused for the client's count
ZIP_CHUNK = 256 << 10       # bytes of the zip handed to the response at a time
ZIP_AHEAD = 4               # chunks the zip's thread may make before the reader takes them


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


def _write_zip(files, pipe: _ZipPipe) -> None:
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


async def _zip_pieces(files, release):
    """The zip's bytes as zip_stream makes them on a thread of its own (not a pool's: a slow
    reader holds it); the client's slot back when the response ends or is cut."""
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
