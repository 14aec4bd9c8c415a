"""Exports of a run: its metrics (JSON or CSV, streamed in pages from the store) and its weights
(a Hugging Face safetensors file streamed from the final upload or a checkpoint, or the whole
checkpoint folder as one zip, made as it is sent: nothing on disk). Reads, open to all: the
dashboard's download links; zips at most Settings.max_exports_per_client at once per address.
What each reads and makes is services/exports.py's: here the query is parsed, the client's
export slot taken, and the responses' media types and headers set."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse

from andrea.export import zip_size
from andrea.metrics import StoredRecord
from andrea.services import exports
from andrea.web.deps import RunDep, SettingsDep, StoreDep, get_existing_run
from andrea.web.quotas import ClientSlots, app_state

router = APIRouter(prefix="/api", tags=["runs"])

EXPORT_RETRY_S = 5          # Retry-After of an export refused for the client's count


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
        return StreamingResponse(exports.json_pages(store, run_id), media_type="application/json",
                                 headers={"content-disposition":
                                          f'inline; filename="andrea-{run_id}.json"'})
    return StreamingResponse(exports.csv_pages(store, run), media_type="text/csv", headers={
        "content-disposition": f'attachment; filename="andrea-{run_id}.csv"'})


# ?step=K: the weights of checkpoint K instead of the final upload.
CheckpointStep = Annotated[int | None, Query(ge=1, description="a checkpoint's step")]


@router.get("/runs/{run_id}/model.safetensors")
async def get_model(run: RunDep, settings: SettingsDep, step: CheckpointStep = None):
    """The run's trained weights as a Hugging Face safetensors file (HF names, [out, in]),
    streamed from the weights file piece by piece: a download held open keeps no copy on disk
    and no more than a piece in memory."""
    run_id = run["id"]
    size, pieces = await exports.weights(run, settings.data_dir, step)
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
        files = await exports.checkpoint_files(run, store, settings.data_dir,
                                               settings.corpus_dir, step)
    except BaseException:
        release()
        raise
    name = f"andrea-{run_id}" + (f"-step{step}" if step else "")
    headers = {"content-disposition": f'attachment; filename="{name}.zip"'}
    if (size := zip_size(files)) is not None:
        headers["content-length"] = str(size)
    # (A response never started still gives the slot back: zip_pieces' finalizer.)
    return StreamingResponse(exports.zip_pieces(files, release), media_type="application/zip",
                             headers=headers)
