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
import secrets
import shutil
import time
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from andrea.data.spec import BatchSpec
from andrea.data.windows import rows_problem
from andrea.durable import fsync_dir
from andrea.optim import optimizer_memory
from andrea.paths import run_dir, weights_path
from andrea.room.init import seeded_weights
from andrea.room.rounds import Room, summary
from andrea.routes.run_files import gone_meanwhile, link_parent, receive_exactly, temp_file
from andrea.run_config import RunConfig, StoredRunConfig, model_name, run_layout, run_model
from andrea.runs.info import checkpoint_info, read_run
from andrea.runs.lifecycle import no_trainer, publish_run
from andrea.runs.sweep import expire_later, mark_unsettled, settled
from andrea.schemas import LayoutWithState, Run, RunCreated, RunDetail, RunUpdate
from andrea.storage import estimated_run_bytes, mib
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
from andrea.write_tokens import new_token, token_hash

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
    """A new run; with `parent`, a branch that starts after the parent's checkpoint (by the
    parent's owner: its checkpoint becomes the branch's, readable with the branch's token)."""
    if config.parent is not None:
        await authorize(request, settings, store, config.parent.run)
    await _run_quotas(request, limiter, store, settings)
    run_id = secrets.token_hex(6)
    token = new_token()
    # The run is tied to this server's corpus: a restart on other text answers 409, not
    # silently different batches; export finds the run's tokenizer by it.
    # (Read from disk the first time: off the event loop.)
    corpus_hash = "" if config.task else await asyncio.to_thread(data.corpus_hash)
    sources = config.sources
    if sources is not None:      # the picked sources: this corpus's, in its order
        sources = _picked_sources(sources, [s.name for s in data.sources()])
    cfg = StoredRunConfig.of(config, corpus_hash, sources=sources)
    spec = BatchSpec.of_run(cfg)
    await _corpus_serves(spec, data)
    layout = run_layout(cfg)
    await _storage_quota(cfg, layout, data, settings, storage)
    join_token = None
    if config.room is not None:
        # A room run is open to its workers from now on: `running` until its last round closes
        # (the sweep never expires it), its join token shown once, as the write token is.
        join_token = new_token()
        room = Room(ckpts.data_dir, ckpts, run_id, cfg, layout)
        held = await _room_quota(room, settings, storage)
        try:
            await store.run(store.runs.create, run_id, cfg, token_hash(token), None)
            # Version 0 is the run's seeded init, made here: no worker uploads it.
            await asyncio.to_thread(lambda: room.create(
                join_token, seeded_weights(layout, cfg.seed), time.time()))
        finally:
            held.release()
        await store.run(store.runs.set_status, run_id, "running", "a room run: open to its workers")
    elif config.parent is None:
        await store.run(store.runs.create, run_id, cfg, token_hash(token), None)
        # Its viewers (and the list) read "never started" once the grace period has passed
        # without a trainer; the app's sweep expires it too (after a restart: expire_runs).
        fanout.spawn(expire_later(store, fanout, settings.start_grace_s))
    else:
        await _branch(run_id, cfg, token_hash(token), store, fanout, ckpts)
    runs.register(run_id, spec)
    return RunCreated(
        id=run_id, token=token, config=cfg, layout=layout,
        optimizer_state=optimizer_memory(layout),
        # The run's data routes, made by the app from their names ({step} and {index} left
        # for the trainer to fill).
        data={"batches": request.app.url_path_for("run_batch", run_id=run_id, step="{step}"),
              "val_batches": request.app.url_path_for("run_val_batch", run_id=run_id,
                                                      index="{index}"),
              "tokenizer": request.app.url_path_for(
                  "tokenizer", key=tokenizer_key(cfg.task, cfg.vocab_size)),
              "spec": spec.to_dict()},
        checkpoint=checkpoint_info(cfg, cfg.parent and cfg.parent.step),
        room=join_token and {
            "join_token": join_token,
            "room": request.app.url_path_for("get_room", run_id=run_id),
            "batches": request.app.url_path_for("room_batch", run_id=run_id,
                                                version="{version}", slot="{slot}",
                                                step="{step}")})


async def _room_quota(room: Room, settings, storage):
    """A room this server can hold, or 422 with the number (ANDREA_ROOM_MAX_PARAMS); then its
    most bytes on disk at once (max_workers pseudo-gradients of a round and three versions:
    the two kept and a close's new one) must fit the storage budget now (507), and version
    0's are reserved (the Reservation, to release once written)."""
    if room.numel > settings.room_max_params:
        raise HTTPException(422, f"a room run of {room.numel:,} parameters is more than this "
                                 f"server holds ({settings.room_max_params:,}, "
                                 "ANDREA_ROOM_MAX_PARAMS): choose a smaller model")
    most = room.room.max_workers * room.expected_bytes() + 3 * room.close_bytes()
    (await storage.reserve(most, "a room run's rounds")).release()
    return await storage.reserve(room.close_bytes(), "a room run's version 0")


async def _run_quotas(request: Request, limiter, store, settings) -> None:
    """A new run's quotas: the client's rate (429) and the runs stored in all (507); its
    storage is _storage_quota's."""
    limiter.check(request.client.host if request.client else "", "new runs")
    count = await store.run(store.runs.count)
    if count >= settings.max_runs:
        raise HTTPException(507, f"this server holds {count} runs, its limit (ANDREA_MAX_RUNS):"
                                 " delete runs you no longer need (the runs page, or DELETE "
                                 "/api/runs/{id}), then create this one again")


async def _storage_quota(cfg: StoredRunConfig, layout: dict, data, settings, storage) -> None:
    """The records a new run's config will store (storage.estimated_run_bytes: its steps, each
    with per-row losses, per-tensor grad norms and source losses): 422 past max_run_bytes (the
    config asks for more than a run may have here: fewer steps or a smaller batch), 507 when
    they do not fit above the data dir's floor (the server's state: free space, try again)."""
    sources = len(cfg.sources) if cfg.sources else len(await asyncio.to_thread(data.sources))
    steps, batch, tensors = cfg.steps, cfg.batch_size, len(layout["params"])
    per_step = estimated_run_bytes(1, batch, tensors, sources)
    estimate = estimated_run_bytes(steps, batch, tensors, sources)
    how = (f"{steps:,} steps x ~{per_step / 1000:,.1f} KB a record: per-row losses of batch "
           f"{batch}, grad norms of {tensors} tensors")
    if estimate > settings.max_run_bytes:
        fits = settings.max_run_bytes // per_step
        raise HTTPException(422, f"this run's records would take about {mib(estimate)} in the "
                                 f"store ({how}), more than the {mib(settings.max_run_bytes)} "
                                 "a run may store on this server (ANDREA_MAX_RUN_BYTES): ask "
                                 f"for at most {fits:,} steps, or a smaller batch_size. "
                                 "Nothing was stored")
    await storage.check_run(estimate, how)


async def _corpus_serves(spec: BatchSpec, data) -> None:
    """422 for a run whose rows this corpus cannot hold (windows.rows_problem: its seq_len + 1
    tokens in a training part and in a held-out tail, in each picked source when it picks
    some), with the sizes, before anything is stored: it used to be accepted and fail at
    batch 0. Read from the token files of the run's vocab size when they are made (the start's
    warm-up makes the presets'); a vocab size nobody asked for yet is not built here (that
    took tens of seconds on a loaded machine, past clients' timeouts): its first batch says
    the same."""
    corpus = None if spec.task else data.ready(spec.vocab_size)
    if corpus is None:
        return
    if why := rows_problem(corpus.files, spec):
        raise HTTPException(422, f"the corpus cannot serve this run: {why}. Nothing was stored")


def _picked_sources(picked: list[str], names: list[str]) -> list[str]:
    """A run's `sources`, checked against this server's corpus (422 names each unknown one and
    lists the known), in corpus order (the batch header's source indices)."""
    unknown = [s for s in picked if s not in names]
    if unknown:
        raise HTTPException(422, f"sources: unknown source{'s' * (len(unknown) > 1)} "
                                 f"{', '.join(map(repr, unknown))}; this server's sources are "
                                 f"{', '.join(names)} (GET /api/corpus)")
    return [n for n in names if n in picked]


async def _branch(run_id: str, cfg: StoredRunConfig, token_sha256: str, store, fanout,
                  ckpts) -> None:
    """The parent's checkpoint K becomes the new run's checkpoint K (hard-linked), its metrics
    and events up to K are copied, and the run starts at step K + 1, as a resume does."""
    parent_id, step = cfg.parent.run, cfg.parent.step
    parent = await store.run(store.runs.get, parent_id)
    if parent is None:
        raise HTTPException(404, f"unknown parent run {parent_id!r}")
    pc = parent["config"]
    if pc.room is not None:
        raise HTTPException(409, f"run {parent_id} is a room run: its checkpoints hold the "
                                 "room's global weights, not one trainer's state to go on from")
    if (run_model(pc), pc.optimizer) != (run_model(cfg), cfg.optimizer):
        raise HTTPException(409, f"a branch keeps its parent's model and optimizer (the "
                                 f"checkpoint's sections): run {parent_id} is {model_name(pc)} "
                                 f"with {pc.optimizer}, this config {model_name(cfg)} with "
                                 f"{cfg.optimizer}")
    if step >= cfg.steps:
        raise HTTPException(409, f"the branch starts after step {step}: its steps "
                                 f"({cfg.steps}) must be more than that")
    committed = await store.run(store.metrics.last_step, parent_id) or 0
    if step > committed:   # the branch copies the parent's records up to its step
        raise HTTPException(409, f"run {parent_id}'s records are committed up to step "
                                 f"{committed}: branch from a checkpoint at or before it")
    # The files come before the row: marked, so that a stop in between leaves none behind.
    await asyncio.to_thread(mark_unsettled, ckpts.data_dir, run_id)
    await link_parent(ckpts, fanout, parent_id, step, run_id)   # 404 without that checkpoint
    name = f"{parent['name']} · branch at {step}"[:120]
    try:   # the copy goes in pages: trainers' commits go on between them
        why_not = await store.runs.branch(run_id, cfg, token_sha256, parent_id, step, name)
        if why_not:
            raise HTTPException(409, f"{why_not}; nothing of the branch was kept")
    except BaseException:
        await asyncio.to_thread(ckpts.remove_run, run_id)
        raise
    await asyncio.to_thread(settled, ckpts.data_dir, run_id)


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
    fields = update.model_dump(exclude_unset=True, exclude_none=True)
    if "name" in fields:
        fields["name"] = fields["name"].strip()
        if not fields["name"]:
            raise HTTPException(422, "a run's name cannot be empty")
    if "tags" in fields:
        tags = [t.strip() for t in fields["tags"] if t.strip()]
        fields["tags"] = list(dict.fromkeys(tags))        # unique, in order
    run_id = run["id"]
    if not await store.run(store.runs.update, run_id, fields):
        raise HTTPException(404, f"unknown run {run_id!r}")
    return await publish_run(store, fanout, run_id)


@router.delete("/runs/{run_id}", status_code=204)
async def delete_run(run: OwnedRunDep, store: StoreDep, fanout: FanoutDep, runs: RunsDep,
                     settings: SettingsDep) -> Response:
    """The run, its metrics, events, checkpoints and weights. 409 while a trainer is
    connected (the tab training it would go on writing): stop it there first."""
    run_id = run["id"]
    busy = "a tab is training this run: stop it there first, or wait until its trainer is gone"
    async with no_trainer(fanout, run_id, busy):    # no hello, resume or checkpoint commit
        # Marked first: a stop between the row's delete and the files' leaves them findable.
        await asyncio.to_thread(mark_unsettled, settings.data_dir, run_id)
        if not await store.run(store.runs.delete, run_id):
            await asyncio.to_thread(settled, settings.data_dir, run_id)
            raise HTTPException(404, f"unknown run {run_id!r}")
        await asyncio.to_thread(shutil.rmtree, run_dir(settings.data_dir, run_id), True)
    runs.forget(run_id)
    fanout.publish(run_id, {"type": "deleted", "run_id": run_id})
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
