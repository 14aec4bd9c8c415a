"""Exports of a run: its metrics (JSON or CSV, streamed in pages from the store) and its weights
(a Hugging Face safetensors file streamed from the final upload or a checkpoint, or the whole
checkpoint folder as one zip). Reads, open to all: the dashboard's download links."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from andrea.deps import RunDep, SettingsDep, StoreDep
from andrea.export import export_run, safetensors_stream, tokenizer_path, zip_folder
from andrea.metrics import COLUMNS, StoredRecord
from andrea.model import run_layout

router = APIRouter(prefix="/api", tags=["runs"])

METRICS_PAGE = 2000         # records read (and sent) at a time: a big run is never held whole
TENSOR_NORM_COLUMN = "grad_norm:"   # + a tensor's name: the CSV column of its gradient norm

@router.get("/runs/{run_id}/metrics", response_model=list[StoredRecord],
            responses={200: {"content": {"text/csv": {}}}})
async def get_metrics(run: RunDep, store: StoreDep,
                      format: Annotated[Literal["json", "csv"], Query()] = "json") -> Response:
    """Every committed step record, oldest first: JSON (fields a step did not report are
    left out) or CSV (one column per numeric field of the record, then `grad_norm:<name>` per
    parameter tensor of the run's layout, from tensor_grad_norms: empty where a step did not
    send it). `time` is when the server committed the row (Unix seconds)."""
    run_id = run["id"]
    if format == "json":
        return StreamingResponse(_json_pages(store, run_id), media_type="application/json",
                                 headers={"content-disposition":
                                          f'inline; filename="andrea-{run_id}.json"'})
    names = [p["name"] for p in run_layout(run["config"])["params"]]
    return StreamingResponse(_csv_pages(store, run_id, names), media_type="text/csv", headers={
        "content-disposition": f'attachment; filename="andrea-{run_id}.csv"'})


async def record_pages(store, run_id: str):
    """The run's committed records, METRICS_PAGE at a time, oldest first."""
    after = None
    while page := await store.run(store.metrics_page, run_id, after, METRICS_PAGE):
        yield page
        after = page[-1]["step"]


async def _json_pages(store, run_id: str):
    sep = "["
    async for page in record_pages(store, run_id):
        yield sep + json.dumps(page, ensure_ascii=False, allow_nan=False,
                               separators=(",", ":"))[1:-1]
        sep = ","
    yield "[]" if sep == "[" else "]"


async def _csv_pages(store, run_id: str, tensor_names: list[str]):
    tensor_columns = [TENSOR_NORM_COLUMN + name for name in tensor_names]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*COLUMNS, *tensor_columns], extrasaction="ignore")
    writer.writeheader()
    async for page in record_pages(store, run_id):
        writer.writerows({**r, **dict(zip(tensor_columns, r.get("tensor_grad_norms") or ()))}
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
async def get_export(run: RunDep, store: StoreDep, settings: SettingsDep,
                     step: CheckpointStep = None):
    """The whole Hugging Face checkpoint (`andrea export` writes the same files) as one zip;
    `andrea export --server` unpacks it. Without the run's tokenizer built yet, the zip holds
    the weights, configs and card only, as a local export does."""
    run_id, data_dir = run["id"], settings.data_dir
    # The card's four facts by query, on a reader thread: no run is read whole.
    records = await store.read(store.card_summary, run_id, step)
    tmp = Path(tempfile.mkdtemp(prefix="andrea-export-", dir=data_dir))
    try:
        await asyncio.to_thread(export_run, run, data_dir,
                                tokenizer_path(settings.corpus_dir, run), tmp / "hf", records,
                                step, settings.corpus_dir)
        await asyncio.to_thread(zip_folder, tmp / "hf", tmp / "export.zip")
        await asyncio.to_thread(shutil.rmtree, tmp / "hf")   # one copy held while it is sent
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, FileNotFoundError):   # no weights uploaded yet, no such checkpoint
            raise HTTPException(404, str(e)) from e
        if isinstance(e, ValueError):          # weights of the wrong size, a foreign tokenizer,
                                               # a damaged checkpoint
            raise HTTPException(500, str(e)) from e
        raise
    name = f"andrea-{run_id}" + (f"-step{step}" if step else "")
    return FileResponse(tmp / "export.zip", media_type="application/zip",
                        filename=f"{name}.zip",
                        background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True))
