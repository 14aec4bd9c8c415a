"""Runs: create (config -> id, write token, layout, data info), list, read, export metrics."""

from __future__ import annotations

import asyncio
import csv
import hmac
import io
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.background import BackgroundTask

from andrea.data.spec import BatchSpec
from andrea.export import export_run, weights_path
from andrea.model import PRESETS, build_layout
from andrea.optim import optimizer_memory
from andrea.run_info import public_run
from andrea.store import METRIC_COLUMNS
from andrea.telemetry import token_hash

router = APIRouter(prefix="/api")

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class RunConfig(BaseModel):
    """Everything but `preset` has a default, so {"preset": "tiny"} is a valid run."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    preset: Literal[tuple(PRESETS)]                                  # type: ignore[valid-type]
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    f16_mirror: bool = False          # forward/backward matmuls read an f16 copy of the weights
    steps: int = Field(200, ge=1, le=1_000_000)
    batch_size: int = Field(8, ge=1, le=1024)
    seq_len: int | None = Field(None, ge=2, description="default: the preset's context")
    lr: Positive = Field(3e-3, le=1.0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)    # cosine decays to lr * min_lr_ratio
    warmup_steps: int | None = Field(None, ge=0, description="default: min(20, steps // 10)")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: Positive = Field(1e-8, le=1.0)
    weight_decay: float = Field(0.1, ge=0, le=1)
    clip: bool = True
    max_norm: Positive = Field(1.0, le=1e6)
    seed: int = Field(0, ge=0, lt=2**31)
    data_mode: Literal["uniform", "bandit"] = "uniform"
    eval_every: int = Field(50, ge=0, description="0: no eval")
    sample_every: int = Field(100, ge=0, description="0: no samples")

    @model_validator(mode="after")
    def _fit_preset(self):
        T = PRESETS[self.preset].seq_len
        if self.seq_len is None:
            self.seq_len = T
        if self.seq_len > T:
            raise ValueError(f"seq_len {self.seq_len} exceeds preset {self.preset}'s context {T}")
        if self.warmup_steps is None:
            self.warmup_steps = min(20, self.steps // 10)
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self


@router.post("/runs", status_code=201)
async def create_run(request: Request, config: RunConfig) -> dict:
    app = request.app
    store = app.state.store
    run_id = secrets.token_hex(6)
    token = secrets.token_urlsafe(24)
    cfg = config.model_dump()
    layout = {"preset": config.preset, **build_layout(PRESETS[config.preset])}
    # The run is tied to this server's corpus: a restart on other text answers 409, not
    # silently different batches; export finds the run's tokenizer by it.
    cfg["corpus_hash"] = app.state.data.corpus_hash()
    spec = batch_spec(cfg)
    await store.run(store.create_run, run_id, cfg, token_hash(token))
    app.state.runs.register(run_id, spec)
    return {"id": run_id, "token": token, "config": cfg, "layout": layout,
            "optimizer_state": optimizer_memory(layout),
            "data": {"batches": f"/api/runs/{run_id}/batches/{{step}}",
                     "val_batches": f"/api/runs/{run_id}/val_batches/{{index}}",
                     "tokenizer": f"/api/tokenizer/{config.preset}", "spec": spec.to_dict()}}


def batch_spec(cfg: dict) -> BatchSpec:
    """The data side of a run config (also used to restore runs after a restart)."""
    return BatchSpec(seed=cfg["seed"], batch_size=cfg["batch_size"], seq_len=cfg["seq_len"],
                     vocab_size=PRESETS[cfg["preset"]].vocab_size, total_steps=cfg["steps"],
                     mode=cfg["data_mode"], corpus_hash=cfg["corpus_hash"])


@router.get("/runs")
async def list_runs(request: Request) -> list[dict]:
    store = request.app.state.store
    return [public_run(r) for r in await store.run(store.list_runs)]


async def _run_or_404(request: Request, run_id: str) -> dict:
    store = request.app.state.store
    run = await store.run(store.get_run, run_id)
    if run is None:
        raise HTTPException(404, f"unknown run {run_id!r}")
    return run


@router.get("/runs/{run_id}")
async def get_run(request: Request, run_id: str) -> dict:
    run = await _run_or_404(request, run_id)
    store = request.app.state.store
    data_dir = request.app.state.settings.data_dir
    return {**public_run(run), "samples": await store.run(store.events, run_id, "sample"),
            "has_weights": weights_path(data_dir, run_id).exists()}


@router.get("/runs/{run_id}/metrics")
async def get_metrics(request: Request, run_id: str,
                      format: Annotated[Literal["json", "csv"], Query()] = "json"):
    await _run_or_404(request, run_id)
    store = request.app.state.store
    rows = await store.run(store.metrics, run_id)
    if format == "json":
        return JSONResponse(rows, headers={
            "content-disposition": f'inline; filename="andrea-{run_id}.json"'})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*METRIC_COLUMNS, "opt_ms"], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return Response(buf.getvalue(), media_type="text/csv", headers={
        "content-disposition": f'attachment; filename="andrea-{run_id}.csv"'})


@router.put("/runs/{run_id}/weights", status_code=204)
async def put_weights(request: Request, run_id: str):
    """The training tab's final weights: W as little-endian f32 in table order, exactly
    total_numel floats, authorised by the run's write token (Authorization: Bearer ...)."""
    store = request.app.state.store
    row = await store.run(store.get_run_with_token, run_id)
    if row is None:
        raise HTTPException(404, f"unknown run {run_id!r}")
    token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(row["token_sha256"], token_hash(token)):
        raise HTTPException(403, "wrong or missing write token")
    run = await store.run(store.get_run, run_id)
    expected = 4 * build_layout(PRESETS[run["config"]["preset"]])["total_numel"]
    dest = weights_path(request.app.state.settings.data_dir, run_id)
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
async def get_model(request: Request, run_id: str):
    """The run's trained weights as a Hugging Face safetensors file (HF names, [out, in])."""
    run = await _run_or_404(request, run_id)
    settings = request.app.state.settings
    out = Path(tempfile.mkdtemp(prefix="andrea-export-", dir=settings.data_dir))
    try:
        await asyncio.to_thread(export_run, run, settings.data_dir, None, out)
    except FileNotFoundError as e:
        shutil.rmtree(out, ignore_errors=True)
        raise HTTPException(404, str(e)) from e
    return FileResponse(out / "model.safetensors", media_type="application/octet-stream",
                        filename=f"andrea-{run_id}.safetensors",
                        background=BackgroundTask(shutil.rmtree, out, ignore_errors=True))
