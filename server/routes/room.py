"""A room run's API (server/room/): workers join with the room's join link, train a global
version, send their pseudo-gradients, and take the next version.

  GET    /api/runs/{id}/room                     the room now: version, workers, open round,
                                                 closed rounds, eval medians (public, as every
                                                 run's reads)
  POST   /api/runs/{id}/room/workers             join (Bearer: the join token) -> worker id,
                                                 data slot, worker token, version to train
                                                 (X-Andrea-Worker-Token: that worker again)
  DELETE /api/runs/{id}/room/workers             leave (Bearer: the worker token)
  DELETE /api/runs/{id}/room/workers/{w}         the run's owner removes worker w for good
  GET    /api/runs/{id}/room/weights/{v}         global version v's weights, f32 [total_numel]
                                                 (version 0: the server's seeded init)
  GET    /api/runs/{id}/room/updates/{v}         an int8 room's newest version v as an update
                                                 of v - 1 (the codec's int8 body), 4x smaller
  POST   /api/runs/{id}/room/deltas/{v}          the worker's pseudo-gradient for version v
                                                 (global - its weights, in the room's codec;
                                                 ?steps=k: of k inner steps, in a cut round)
  POST   /api/runs/{id}/room/reports/{v}         its inner losses of that round, the eval
                                                 loss of version v's weights, and its timings
                                                 (ms waiting for v, downloading, evaluating,
                                                 training and sending it)
  GET    /api/runs/{id}/room/reports             the reports, paged (offset, limit)
  POST   /api/runs/{id}/room/progress/{v}        the worker's inner step of version v now
                                                 (the room's page shows who trains, sends,
                                                 waits)
  GET    /api/runs/{id}/room/batches/{v}/{slot}/{step}   (data.py) a worker's batch
  GET    /api/runs/{id}/room/lone                the lone tab the room's page compares it with
                                                 (room/lone.py): the newest single run that
                                                 trains what a worker trains, or null and the
                                                 config to make one

Only a worker's token may send (the join token only joins: a participant is never the run's
owner), checked before a byte of a body is read. A pseudo-gradient is exactly the codec's size
for the model (413/400 before a byte is stored otherwise), reserved in the storage budget while
it streams, one per worker and round (409 for a second, a stale one, or one for a finished
room), and refused (422; a good one may follow) when a value is not finite or past what the
round's AdamW steps can move an element. What each does is services/rooms.py's: here the tokens
are read, the request parsed, a pseudo-gradient's body streamed to a file, and the answer
shaped."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect

from andrea.room.rounds import Room
from andrea.routes.run_files import receive_exactly, stream_file, temp_file
from andrea.services import rooms
from andrea.web.deps import (
    CheckpointsDep,
    FanoutDep,
    RunDep,
    SettingsDep,
    StorageDep,
    StoreDep,
    authorize,
    bearer,
)

router = APIRouter(prefix="/api/runs/{run_id}/room", tags=["room"])

Version = Annotated[int, Path(ge=0, lt=2**31, description="a global version of the room")]
WorkerId = Annotated[int, Path(ge=0, lt=2**31, description="a worker of the room")]
REPORTS_PAGE = 500          # reports per page by default, and 2x that at most


@router.get("")
async def get_room(run: RunDep, ckpts: CheckpointsDep) -> dict:
    """The room now (services/rooms.py state): version, workers and what each does, the open
    round and what it waits for, closed rounds, eval medians."""
    return await rooms.state(rooms.room_of(run, ckpts))


@router.post("/workers", status_code=201)
async def join_room(run: RunDep, request: Request, ckpts: CheckpointsDep,
                    fanout: FanoutDep) -> dict:
    room = rooms.room_of(run, ckpts)
    # A tab that was a worker before (reloaded, crashed) sends that worker's token to be it
    # again: X-Andrea-Worker-Token.
    again = request.headers.get("x-andrea-worker-token")
    # One participant is one worker: counted by client address (uvicorn's: a trusted proxy's
    # X-Forwarded-For).
    address = request.client.host if request.client else ""
    return await rooms.join(room, fanout, bearer(request), address, again)


@router.delete("/workers", status_code=204)
async def leave_room(run: RunDep, request: Request, ckpts: CheckpointsDep,
                     fanout: FanoutDep, storage: StorageDep, store: StoreDep) -> Response:
    """A worker leaves (its worker token): the open round closes at once where every worker
    left in it has answered."""
    await rooms.leave(rooms.room_of(run, ckpts), store, fanout, storage, bearer(request))
    return Response(status_code=204)


@router.delete("/workers/{worker}", status_code=204)
async def remove_room_worker(run: RunDep, worker: WorkerId, request: Request,
                             ckpts: CheckpointsDep, fanout: FanoutDep, settings: SettingsDep,
                             store: StoreDep, storage: StorageDep) -> Response:
    """The run's owner (or the operator) removes a worker: out of the round, and neither its
    token nor its address joins again."""
    await authorize(request, settings, store, run["id"])
    await rooms.remove(rooms.room_of(run, ckpts), store, fanout, storage, worker)
    return Response(status_code=204)


@router.get("/weights/{version}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
async def get_room_weights(run: RunDep, version: Version, ckpts: CheckpointsDep):
    """Streamed from the verified file, as a checkpoint is: N workers that download a version
    at once hold no copy of it each."""
    size, f = await rooms.weights(rooms.room_of(run, ckpts), version)
    return StreamingResponse(stream_file(f, size), media_type="application/octet-stream",
                             headers={"content-length": str(size), "cache-control": "no-store"})


@router.get("/updates/{version}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
async def get_room_update(run: RunDep, version: Version, ckpts: CheckpointsDep):
    """An int8 room's newest version as the update of the one before it (the codec's int8
    body): a worker that holds version - 1 adds it and has the version, at a quarter of the
    weights' bytes. 404 for any other version, or a room of another codec: take the weights."""
    size, f = await rooms.update(rooms.room_of(run, ckpts), version)
    return StreamingResponse(stream_file(f, size), media_type="application/octet-stream",
                             headers={"content-length": str(size), "cache-control": "no-store"})


@router.post("/deltas/{version}")
async def post_room_delta(run: RunDep, version: Version, request: Request, ckpts: CheckpointsDep,
                          fanout: FanoutDep, storage: StorageDep, store: StoreDep,
                          steps: Annotated[int | None, Query(ge=1, le=100_000, description=(
                              "the inner steps it was trained over (default: the round's "
                              "inner_steps; fewer only once the round is cut)"))] = None
                          ) -> dict:
    room = rooms.room_of(run, ckpts)
    token = bearer(request)
    await rooms.check_sender(room, token)       # before a byte of the body is read
    path = await _receive(request, room, room.expected_bytes(),
                          f"a {room.room.codec} pseudo-gradient", storage)
    return await rooms.accept_delta(room, store, fanout, storage, token, version, path, steps)


Ms = Annotated[float, Field(ge=0, le=1e9)]


class Timings(BaseModel):
    """How the worker spent the report's version, in ms by its own clock, in this order
    (room_worker.js): waiting for it to appear, downloading it, evaluating it, training its
    inner steps, sending the pseudo-gradient. Their sum is its time on the version."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    wait_ms: Ms
    download_ms: Ms
    eval_ms: Ms
    train_ms: Ms
    send_ms: Ms


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=True)
    losses: list[float] = Field(max_length=100_000)
    eval_loss: float | None = None
    timings: Timings | None = None


@router.post("/reports/{version}", status_code=204)
async def post_room_report(run: RunDep, version: Version, body: Report, request: Request,
                           ckpts: CheckpointsDep, fanout: FanoutDep,
                           settings: SettingsDep) -> Response:
    await rooms.report(rooms.room_of(run, ckpts), fanout, bearer(request), version, body.losses,
                       body.eval_loss, None if body.timings is None else body.timings.model_dump(),
                       settings.max_run_bytes)
    return Response(status_code=204)


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    step: int = Field(ge=0, le=100_000, description="inner steps of the round done")


@router.post("/progress/{version}", status_code=204)
async def post_room_progress(run: RunDep, version: Version, body: Progress, request: Request,
                             ckpts: CheckpointsDep, fanout: FanoutDep) -> Response:
    """A worker's inner step now (its worker token): the room's page shows it. Not a report:
    nothing of it is kept once the round moves on."""
    await rooms.progress(rooms.room_of(run, ckpts), fanout, bearer(request), version, body.step)
    return Response(status_code=204)


@router.get("/reports")
async def get_room_reports(run: RunDep, ckpts: CheckpointsDep,
                           offset: Annotated[int, Query(ge=0)] = 0,
                           limit: Annotated[int, Query(ge=1, le=2 * REPORTS_PAGE)] = REPORTS_PAGE
                           ) -> dict:
    """The reports offset..offset + limit, oldest first; `next`: the next page's offset."""
    return await rooms.reports(rooms.room_of(run, ckpts), offset, limit)


@router.get("/lone")
async def get_room_lone(run: RunDep, ckpts: CheckpointsDep, store: StoreDep,
                        settings: SettingsDep) -> dict:
    """"Did the room help?": {"run": the newest single run (no room, no parent) of the same
    model shape, batch, context, optimizer, lr and corpus, or null; "name", "status"; "why":
    in words;
    "config": what POST /api/runs takes to train one (the room's config less its room)}.
    Bounded: the newest LONE_SCAN runs' rows are read, whatever the server holds."""
    return await rooms.lone(run, ckpts, store, settings)


async def _receive(request: Request, room: Room, expected: int, what: str,
                   storage) -> pathlib.Path:
    """The body into a temp file in the room's folder (exactly `expected` bytes, refused as
    soon as it is not), reserved in the storage budget while it streams."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdecimal()):
            raise HTTPException(400, f"bad Content-Length {declared[:40]!r}")
        _check_length(int(declared), expected, what)
    held = await storage.reserve(expected, what)
    try:
        path = await asyncio.to_thread(temp_file, room.dir)
    except BaseException:
        held.release()
        raise
    try:
        with await asyncio.to_thread(open, path, "wb") as f:
            await receive_exactly(request, expected, f.write, held, lambda size, more:
                                  _check_length(size, expected, what, more))
        return path
    except ClientDisconnect:
        path.unlink(missing_ok=True)
        raise HTTPException(400, f"the client went away during the upload of {what}; nothing "
                                 "was stored") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        held.release()


def _check_length(got: int, expected: int, what: str, more: bool = False) -> None:
    if got != expected:
        raise HTTPException(413 if got > expected else 400,
                            f"{what} of this room's model is exactly {expected} bytes; the body "
                            f"is {got} bytes{' or more' if more else ''}. Nothing was stored")
