"""Runs: create (config -> id, write token, layout, data info), list, read, export metrics."""

from __future__ import annotations

import asyncio
import csv
import io
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.background import BackgroundTask

from andrea.auth import new_token, token_hash, token_matches
from andrea.data.spec import BatchSpec
from andrea.deps import DataDep, RunDep, RunsDep, SettingsDep, StoreDep
from andrea.export import export_run, tokenizer_path, weights_path, write_weights, zip_folder
from andrea.metrics import COLUMNS, Record
from andrea.model import PRESETS, build_layout
from andrea.optim import optimizer_memory
from andrea.run_config import RunConfig
from andrea.run_info import public_run
from andrea.schemas import Run, RunCreated, RunDetail

router = APIRouter(prefix="/api", tags=["runs"])


@router.get("/run_config")
def run_config_schema() -> dict:
    """RunConfig's JSON schema: every field's default and bounds (the new-run form's too)."""
    return RunConfig.model_json_schema()


@router.post("/runs", status_code=201)
async def create_run(config: RunConfig, store: StoreDep, data: DataDep,
                     runs: RunsDep) -> RunCreated:
    run_id = secrets.token_hex(6)
    token = new_token()
    # The run is tied to this server's corpus: a restart on other text answers 409, not
    # silently different batches; export finds the run's tokenizer by it.
    # (Read from disk the first time: off the event loop.)
    cfg = {**config.model_dump(), "corpus_hash": await asyncio.to_thread(data.corpus_hash)}
    spec = BatchSpec.of_run(cfg)
    layout = {"preset": config.preset, **build_layout(PRESETS[config.preset])}
    await store.run(store.create_run, run_id, cfg, token_hash(token))
    runs.register(run_id, spec)
    return RunCreated(
        id=run_id, token=token, config=cfg, layout=layout,
        optimizer_state=optimizer_memory(layout),
        data={"batches": f"/api/runs/{run_id}/batches/{{step}}",
              "val_batches": f"/api/runs/{run_id}/val_batches/{{index}}",
              "tokenizer": f"/api/tokenizer/{config.preset}", "spec": spec.to_dict()})


@router.get("/runs")
async def list_runs(store: StoreDep) -> list[Run]:
    return [public_run(r) for r in await store.run(store.list_runs)]


@router.get("/runs/{run_id}")
async def get_run(run: RunDep, store: StoreDep, settings: SettingsDep) -> RunDetail:
    return {**public_run(run), "samples": await store.run(store.events, run["id"], "sample"),
            "has_weights": weights_path(settings.data_dir, run["id"]).exists()}


@router.get("/runs/{run_id}/metrics", response_model=list[Record],
            responses={200: {"content": {"text/csv": {}}}})
async def get_metrics(run: RunDep, store: StoreDep,
                      format: Annotated[Literal["json", "csv"], Query()] = "json") -> Response:
    """Every committed step record, oldest first: JSON (fields a step did not report are
    left out) or CSV (one column per numeric field of the record)."""
    run_id = run["id"]
    rows = await store.run(store.metrics, run_id)
    if format == "json":
        return JSONResponse(rows, headers={
            "content-disposition": f'inline; filename="andrea-{run_id}.json"'})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return Response(buf.getvalue(), media_type="text/csv", headers={
        "content-disposition": f'attachment; filename="andrea-{run_id}.csv"'})


@router.put("/runs/{run_id}/weights", status_code=204)
async def put_weights(request: Request, run: RunDep, store: StoreDep, settings: SettingsDep):
    """The training tab's final weights: W as little-endian f32 in table order, exactly
    total_numel floats, authorised by the run's write token (Authorization: Bearer ...)."""
    run_id = run["id"]
    row = await store.run(store.get_run_with_token, run_id)
    token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not token_matches(row["token_sha256"], token):
        raise HTTPException(403, "wrong or missing write token")
    expected = 4 * build_layout(PRESETS[run["config"]["preset"]])["total_numel"]
    dest = weights_path(settings.data_dir, run_id)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    size = 0
    with open(tmp, "wb") as f:   # streamed to disk off the event loop, never held whole
        async for chunk in request.stream():
            size += len(chunk)
            if size > expected:
                break
            await asyncio.to_thread(f.write, chunk)
    if size != expected:
        tmp.unlink(missing_ok=True)
        raise HTTPException(413 if size > expected else 400,
                            f"weights must be exactly {expected} bytes (got {size}"
                            f"{' or more' if size > expected else ''})")
    tmp.replace(dest)   # atomic: a reader never sees half a file


@router.get("/runs/{run_id}/model.safetensors")
async def get_model(run: RunDep, settings: SettingsDep):
    """The run's trained weights as a Hugging Face safetensors file (HF names, [out, in])."""
    run_id = run["id"]
    out = Path(tempfile.mkdtemp(prefix="andrea-export-", dir=settings.data_dir))
    try:
        await asyncio.to_thread(write_weights, run, settings.data_dir, out)
    except FileNotFoundError as e:
        shutil.rmtree(out, ignore_errors=True)
        raise HTTPException(404, str(e)) from e
    return FileResponse(out / "model.safetensors", media_type="application/octet-stream",
                        filename=f"andrea-{run_id}.safetensors",
                        background=BackgroundTask(shutil.rmtree, out, ignore_errors=True))


@router.get("/runs/{run_id}/export.zip")
async def get_export(run: RunDep, store: StoreDep, settings: SettingsDep):
    """The whole Hugging Face checkpoint (`andrea export` writes the same files) as one zip;
    `andrea export --server` unpacks it. Without the run's tokenizer built yet, the zip holds
    the weights, configs and card only, as a local export does."""
    run_id, data_dir = run["id"], settings.data_dir
    metrics = await store.run(store.metrics, run_id)
    tmp = Path(tempfile.mkdtemp(prefix="andrea-export-", dir=data_dir))
    try:
        await asyncio.to_thread(export_run, run, data_dir, tokenizer_path(data_dir, run),
                                tmp / "hf", metrics)
        await asyncio.to_thread(zip_folder, tmp / "hf", tmp / "export.zip")
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, FileNotFoundError):   # no weights uploaded yet
            raise HTTPException(404, str(e)) from e
        if isinstance(e, ValueError):          # weights of the wrong size, a foreign tokenizer
            raise HTTPException(500, str(e)) from e
        raise
    return FileResponse(tmp / "export.zip", media_type="application/zip",
                        filename=f"andrea-{run_id}.zip",
                        background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True))
