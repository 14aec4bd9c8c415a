"""Checkpoints and resume: the training tab uploads its complete state every so often; another
tab (or `andrea train --resume`) takes a run over from the newest one with a new write token.

  PUT  /api/runs/{id}/checkpoints/{step}   body = the sections (optim.checkpoint_sections),
                                           X-Andrea-Chunk-SHA256 = one digest per chunk
  GET  /api/runs/{id}/checkpoints          the committed ones, newest last (public)
  GET  /api/runs/{id}/checkpoints/{step}   the sections, verified first (the run's write token
                                           or the operator's, even from this machine)
  POST /api/runs/{id}/resume               a new token; metrics after the checkpoint dropped
                                           (by the run's owner: deps.authorize)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from andrea import checkpoints
from andrea.checkpoints import (
    CheckpointError,
    parse_digests,
    refusal_of,
)
from andrea.errors import Refused
from andrea.optim import checkpoint_sections
from andrea.routes.run_files import receive_exactly, stream_file
from andrea.run_config import StoredRunConfig, model_name, run_layout
from andrea.schemas import CheckpointListed, CheckpointStored, RunResumed
from andrea.services import runs as run_service
from andrea.services.runs import gone_meanwhile
from andrea.web.deps import (
    CheckpointsDep,
    DataDep,
    FanoutDep,
    OwnedRunDep,
    RunDep,
    RunsDep,
    SettingsDep,
    StorageDep,
    StoreDep,
    TokenRunDep,
    WritableRunDep,
    bearer,
    check_write_token,
)

router = APIRouter(prefix="/api", tags=["checkpoints"])
log = logging.getLogger("andrea.checkpoints")

Step = Annotated[int, Path(ge=0)]

def _sections_text(cfg: StoredRunConfig, sections: list[dict]) -> str:
    parts = " + ".join(f"{s['name']} {s['bytes']}" for s in sections)
    return f"{model_name(cfg)} with {cfg.optimizer}: {parts}"


def _check_length(got: int, expected: int, cfg: StoredRunConfig, sections: list[dict],
                  more: bool = False) -> None:
    if got == expected:
        return
    what = "larger than the sections" if got > expected else "truncated"
    raise HTTPException(413 if got > expected else 400,
                        f"a checkpoint of this run is exactly {expected} bytes "
                        f"({_sections_text(cfg, sections)}); the body is {got} bytes"
                        f"{' or more' if more else ''}: {what}, or made for another layout "
                        "or optimizer. Nothing was stored")


@router.put("/runs/{run_id}/checkpoints/{step}", status_code=201)
async def put_checkpoint(step: Step, request: Request, run: WritableRunDep, store: StoreDep,
                         fanout: FanoutDep, ckpts: CheckpointsDep,
                         storage: StorageDep) -> CheckpointStored:
    """The complete training state after `step` steps. On any error the previous checkpoints
    stay as they were. Its bytes are reserved in the storage budget (507 past the data dir's
    floor, uploads at once counted together) until it is stored or refused."""
    run_id, cfg = run["id"], run["config"]
    if cfg.room is not None:
        raise HTTPException(409, "a room run's checkpoints are its global versions, made by the "
                                 "server at each round's close: nothing is uploaded here")
    if not 1 <= step <= cfg.steps:
        raise HTTPException(409, f"step {step} is outside this run's steps 1..{cfg.steps}")
    sections = checkpoint_sections(run_layout(cfg), cfg.optimizer, cfg.precision)
    expected = sum(s["bytes"] for s in sections)
    declared = request.headers.get("content-length")
    if declared is not None:        # refused before reading a byte of a wrong-sized body
        if not (declared.isascii() and declared.isdecimal()):
            raise HTTPException(400, f"bad Content-Length {declared[:40]!r}")
        _check_length(int(declared), expected, cfg, sections)
    held = await storage.reserve(expected, f"checkpoint {step}")    # 507 past the floor
    try:
        chunk = checkpoints.CHUNK_BYTES       # (read at call time: tests make it small)
        digests = parse_digests(request.headers.get("x-andrea-chunk-sha256"), expected, chunk)
        upload = await asyncio.to_thread(ckpts.begin, run_id, step, expected, digests, chunk)
    except BaseException as e:
        held.release()
        if isinstance(e, (CheckpointError, OSError)):
            raise refusal_of(e) or e
        raise
    meta = None
    try:
        await receive_exactly(request, expected, upload.write, held, lambda size, more:
                              _check_length(size, expected, cfg, sections, more))
        async with fanout.run_lock(run_id):
            # The run may have been deleted, or a resume revoked this token, while the body
            # streamed in.
            await gone_meanwhile(store, ckpts.data_dir, run_id, "checkpoint")
            await check_write_token(store, run_id, bearer(request))
            meta = await asyncio.to_thread(ckpts.commit, run_id, upload, cfg.optimizer,
                                           sections)
            newest = await asyncio.to_thread(ckpts.latest, run_id)
            await store.run(store.runs.set_checkpoint_step, run_id, newest and newest["step"])
    except ClientDisconnect:
        log.warning("run %s: the upload of checkpoint %d (%d bytes) was aborted by the client "
                    "before its end; nothing was stored", run_id, step, expected)
        raise HTTPException(400, "the client went away during the upload; nothing was stored") \
            from None
    except (CheckpointError, OSError) as e:
        raise refusal_of(e) or e
    finally:
        held.release()
        await asyncio.to_thread(ckpts.discard, upload)     # a no-op once committed
        if meta is None:    # refused: a delete meanwhile leaves no folder made by begin()
            with contextlib.suppress(Refused):    # gone_meanwhile's, StoreUnavailable
                await gone_meanwhile(store, ckpts.data_dir, run_id, "checkpoint")
    return {"step": meta["step"], "bytes": meta["bytes"], "sha256": meta["sha256"]}


@router.get("/runs/{run_id}/checkpoints")
async def list_checkpoints(run: RunDep, ckpts: CheckpointsDep) -> list[CheckpointListed]:
    metas = await asyncio.to_thread(ckpts.list, run["id"])
    return [{k: m[k] for k in ("step", "bytes", "sha256", "created_at")} for m in metas]


@router.get("/runs/{run_id}/checkpoints/{step}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
async def get_checkpoint(step: Step, run: TokenRunDep, ckpts: CheckpointsDep):
    """The sections, after checking the whole file against its recorded SHA-256."""
    meta, f = await asyncio.to_thread(ckpts.open_verified, run["id"], step)
    return StreamingResponse(stream_file(f), media_type="application/octet-stream", headers={
        "content-length": str(meta["bytes"]), "x-andrea-sha256": meta["sha256"],
        "cache-control": "no-store"})


@router.post("/runs/{run_id}/resume")
async def resume_run(run: OwnedRunDep, store: StoreDep, fanout: FanoutDep,
                     ckpts: CheckpointsDep, runs: RunsDep, data: DataDep,
                     settings: SettingsDep) -> RunResumed:
    """Take a run over from its newest checkpoint (services/runs.resume): a new write token
    (the old one is refused from now on), the metrics and events after the checkpoint
    deleted, status `created`."""
    token, step, info = await run_service.resume(run["id"], store, fanout, ckpts, runs, data,
                                                 settings.trainer_grace_s)
    return {"token": token, "step": step, "run": info}
