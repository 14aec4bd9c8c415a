"""Runs: create (config -> id, write token, layout, data info; or a branch of another run's
checkpoint), list, read, rename/tag/annotate, delete, and the final weights upload (exports are
in exports.py).

Who may change a run (deps.authorize): PATCH (name, tags, notes), DELETE and a branch (POST with
a `parent`: the parent's token) need the run's write token or the operator's
(ANDREA_ADMIN_TOKEN), as `Authorization: Bearer`, checked before the run is looked up; on a
loopback-only server a request that names a loopback host is the machine's own user and needs
none. Every state-changing request from a page of another origin is refused first
(origin_check.py; HostCheck refuses unknown Host names). The weights upload needs the run's
own token (checked again at the end of the body: a resume meanwhile revokes it). Reads stay
public, the weights' exports included (model.safetensors, export.zip, also `?step=K` of a
checkpoint): they are the dashboard's download links; a checkpoint's whole training state is
not (routes/checkpoints.py). DELETE refuses (409)
a run whose trainer is connected: stop it first."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from andrea.durable import fsync_dir
from andrea.optim import optimizer_memory
from andrea.paths import weights_path
from andrea.room.rounds import summary
from andrea.routes.run_files import receive_exactly, temp_file
from andrea.run_config import RunConfig, run_layout
from andrea.runs.info import checkpoint_info, read_run
from andrea.runs.lifecycle import publish_run
from andrea.schemas import LayoutWithState, Run, RunCreated, RunDetail, RunUpdate
from andrea.services import runs as run_service
from andrea.services.runs import gone_meanwhile
from andrea.tasks import tokenizer_key
from andrea.web.deps import (
    CheckpointsDep,
    DataDep,
    FanoutDep,
    OwnedRunDep,
    RunDep,
    RunLimiterDep,
    RunsDep,
    SettingsDep,
    StorageDep,
    StoreDep,
    WritableRunDep,
    authorize,
    bearer,
    check_write_token,
)

router = APIRouter(prefix="/api", tags=["runs"])
log = logging.getLogger("andrea.runs")

SAMPLES_SHOWN = 100         # the newest samples in GET /api/runs/{id} (up to 20k chars each)


@router.get("/run_config")
def run_config_schema() -> dict:
    """RunConfig's JSON schema: every field's default and bounds (the new-run form's too)."""
    return RunConfig.model_json_schema()


@router.post("/run_config/layout")
def run_config_layout(config: RunConfig) -> LayoutWithState:
    """The parameter table and optimizer memory of the model a config describes (its preset, or
    its own shape): the new-run form's memory estimate, and the config checked in words."""
    layout = run_layout(config)
    return LayoutWithState(**layout, optimizer_state=optimizer_memory(layout))


@router.get("/runs/{run_id}/layout")
def get_run_layout(run: RunDep) -> LayoutWithState:
    """The run's parameter table (what its training tab and checkpoints are laid out by)."""
    layout = run_layout(run["config"])
    return LayoutWithState(**layout, optimizer_state=optimizer_memory(layout))


@router.post("/runs", status_code=201)
async def create_run(config: RunConfig, request: Request, store: StoreDep, data: DataDep,
                     runs: RunsDep, fanout: FanoutDep, ckpts: CheckpointsDep,
                     settings: SettingsDep, limiter: RunLimiterDep,
                     storage: StorageDep) -> RunCreated:
    """A new run (services/runs.py create); with `parent`, a branch that starts after the
    parent's checkpoint (by the parent's owner: its checkpoint becomes the branch's, readable
    with the branch's token). A client's new runs are paced (429)."""
    if config.parent is not None:
        await authorize(request, settings, store, config.parent.run)
    limiter.check(request.client.host if request.client else "", "new runs")
    made = await run_service.create(config, store, data, runs, fanout, ckpts, settings, storage)
    run_id, cfg, layout = made.run_id, made.config, made.layout
    return RunCreated(
        id=run_id, token=made.token, config=cfg, layout=layout,
        optimizer_state=optimizer_memory(layout),
        # The run's data routes, made by the app from their names ({step} and {index} left
        # for the trainer to fill).
        data={"batches": request.app.url_path_for("run_batch", run_id=run_id, step="{step}"),
              "val_batches": request.app.url_path_for("run_val_batch", run_id=run_id,
                                                      index="{index}"),
              "tokenizer": request.app.url_path_for(
                  "tokenizer", key=tokenizer_key(cfg.task, cfg.vocab_size)),
              "spec": made.spec.to_dict()},
        checkpoint=checkpoint_info(cfg, cfg.parent and cfg.parent.step),
        room=made.join_token and {
            "join_token": made.join_token,
            "room": request.app.url_path_for("get_room", run_id=run_id),
            "batches": request.app.url_path_for("room_batch", run_id=run_id,
                                                version="{version}", slot="{slot}",
                                                step="{step}")})


# GET /api/runs: runs per page by default, and at most.
RUNS_PAGE, RUNS_PAGE_MAX = 100, 500


class RoomLine(BaseModel):
    """A room run in the runs list (room/rounds.py summary)."""
    version: int                    # rounds closed
    rounds: int
    finished: bool
    training: int                   # active workers now (0 once it finished)
    joined: int                     # workers that ever joined
    eval_loss: float | None         # the last global eval loss (median of its workers')
    eval_version: int | None        # of this version
    best_eval_loss: float | None    # the lowest of the versions' global eval losses
    elapsed_s: float | None         # from its first join to its last round's close


class ListedRun(Run):
    room: RoomLine | None = None    # a room run's room; None for any other run


def _cursor(run: dict) -> str:
    """Where the next page starts: after this run (repr: the float exactly)."""
    return f"{run['created_at']!r}:{run['id']}"


def _parse_cursor(before: str) -> tuple[float, str]:
    created_at, _, run_id = before.partition(":")
    try:
        at = float(created_at)
    except ValueError:
        at = float("nan")
    if not run_id or at != at or at in (float("inf"), float("-inf")):
        raise HTTPException(400, f"bad cursor before={before[:80]!r}: follow the Link header "
                                 "(rel=\"next\") of the previous page")
    return at, run_id


@router.get("/runs")
async def list_runs(response: Response, store: StoreDep, fanout: FanoutDep,
                    settings: SettingsDep,
                    limit: Annotated[int, Query(ge=1, le=RUNS_PAGE_MAX)] = RUNS_PAGE,
                    before: Annotated[str | None, Query(max_length=200)] = None
                    ) -> list[ListedRun]:
    """A page of runs, newest first: `limit` of them, those after the cursor `before`. A
    `Link: <...>; rel="next"` header names the next page while there may be more, and
    X-Total-Count says how many are listed (a branch still being made is neither). Their rows
    alone (reading them costs the same however many records they hold), and a room run's
    room in a line (`room`: rounds, workers now, last global eval loss); nothing is written."""
    rows = await store.run(store.runs.page, limit, before and _parse_cursor(before))
    response.headers["X-Total-Count"] = str(await store.run(store.runs.count, True))
    if len(rows) == limit:
        response.headers["Link"] = (f"</api/runs?limit={limit}&before="
                                    f"{quote(_cursor(rows[-1]), safe='')}>; rel=\"next\"")
    rooms = await asyncio.to_thread(lambda: {
        r["id"]: summary(settings.data_dir, r["id"], r["config"]) for r in rows
        if r["config"].room is not None})
    return [{**read_run(r, fanout.has_trainer(r["id"]), settings.start_grace_s),
             "room": rooms.get(r["id"])} for r in rows]


@router.get("/runs/{run_id}")
async def get_run(run: RunDep, store: StoreDep, settings: SettingsDep,
                  fanout: FanoutDep) -> RunDetail:
    return {**read_run(run, fanout.has_trainer(run["id"]), settings.start_grace_s),
            "samples": await store.run(store.events.all, run["id"], "sample", SAMPLES_SHOWN),
            "has_weights": weights_path(settings.data_dir, run["id"]).exists()}


@router.patch("/runs/{run_id}")
async def update_run(update: RunUpdate, run: OwnedRunDep, store: StoreDep,
                     fanout: FanoutDep) -> Run:
    """Rename a run, set its tags or notes (by its owner: see the module's docstring)."""
    return await run_service.update(store, fanout, run["id"],
                                    update.model_dump(exclude_unset=True, exclude_none=True))


@router.delete("/runs/{run_id}", status_code=204)
async def delete_run(run: OwnedRunDep, store: StoreDep, fanout: FanoutDep, runs: RunsDep,
                     settings: SettingsDep) -> Response:
    """The run, its metrics, events, checkpoints and weights. 409 while a trainer is
    connected (the tab training it would go on writing): stop it there first."""
    await run_service.delete(store, fanout, runs, settings.data_dir, run["id"])
    return Response(status_code=204)


@router.put("/runs/{run_id}/weights", status_code=204)
async def put_weights(request: Request, run: WritableRunDep, settings: SettingsDep,
                      store: StoreDep, fanout: FanoutDep, storage: StorageDep):
    """The training tab's final weights: W as little-endian f32 in table order, exactly
    total_numel floats, authorised by the run's write token (Authorization: Bearer ...). Its
    bytes are reserved in the storage budget (507 past the floor) until stored or refused."""
    run_id = run["id"]
    expected = 4 * run_layout(run["config"])["total_numel"]
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdecimal() and int(declared) > expected:   # unread
        raise HTTPException(413, f"weights must be exactly {expected} bytes (the body is "
                                 f"{declared}); nothing was stored")
    held = await storage.reserve(expected, "the weights")     # 507 past the floor
    dest = weights_path(settings.data_dir, run_id)
    try:
        tmp = await asyncio.to_thread(temp_file, dest.parent)     # this upload's own
    except BaseException:
        held.release()
        raise

    def refuse(size: int, more: bool) -> None:
        raise HTTPException(413 if size > expected else 400,
                            f"weights must be exactly {expected} bytes (got {size}"
                            f"{' or more' if more else ''})")

    try:
        with await asyncio.to_thread(open, tmp, "wb") as f:    # off the event loop
            await receive_exactly(request, expected, f.write, held, refuse)
            await asyncio.to_thread(_sync, f)   # on disk before it is the run's weights
        async with fanout.run_lock(run_id):     # a delete takes it too: not between the two
            await gone_meanwhile(store, settings.data_dir, run_id, "weights")
            # A resume (which takes this lock) may have revoked the token while the body came.
            await check_write_token(store, run_id, bearer(request))
            await asyncio.to_thread(_install, tmp, dest)
    except ClientDisconnect:
        log.warning("run %s: the weights upload of %d bytes was aborted by the client; "
                    "nothing was stored", run_id, expected)
        raise HTTPException(400, "the client went away during the upload; nothing was stored") \
            from None
    except FileNotFoundError:   # the run's folder went with a delete while the body streamed
        await gone_meanwhile(store, settings.data_dir, run_id, "weights")
        raise
    finally:
        held.release()
        tmp.unlink(missing_ok=True)     # (gone once it replaced the weights)
    # Viewers show the model link now, without a reload.
    await publish_run(store, fanout, run_id, has_weights=True)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def _install(tmp, dest) -> None:
    """The upload becomes the weights: atomic (a reader never sees half a file), and lasting."""
    tmp.replace(dest)
    fsync_dir(dest.parent)
