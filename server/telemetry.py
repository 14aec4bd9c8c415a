"""Websocket telemetry (DESIGN.md section 8): the training tab streams step records, the server
validates, commits to SQLite, acks, and fans committed records out to read-only viewers.

Trainer (`/ws/runs/{id}`), client -> server:
  {"type": "hello", "token": str, "last_acked_step": int | null}   first message, always
  {"type": "metrics", "records": [Record, ...]}                     batched, ~every 250 ms
  {"type": "status", "status": "running" | "paused" | "finished" | "stopped" | "failed",
   "message"?: str, "adapter"?: {...}}
  {"type": "sample", "step": int, "text": str}                      generated text
  {"type": "ping"}
server -> client: welcome {last_committed_step}, ack {step}, pong, error {message}.
Viewers (`/ws/runs/{id}/watch`) get {"type": "records", "records": [...]} (backlog first),
{"type": "run", "run": {...}} on status changes and {"type": "sample", ...}.
Close codes: 1003 bad data, 1008 policy (origin, token, unknown run), 1009 too big,
1013 a viewer too slow to keep up (it reconnects and gets the backlog).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from typing import Annotated, Literal, Union

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from andrea.run_info import public_run

log = logging.getLogger("andrea.telemetry")
router = APIRouter()

MAX_MESSAGE_BYTES = 1 << 20      # one metrics batch; a step record is ~200 bytes
MAX_RECORDS = 2000               # per message
MAX_SAMPLE_CHARS = 20_000
VIEWER_QUEUE = 256               # messages buffered per viewer before it is dropped

Finite = Annotated[float, Field(allow_inf_nan=False)]
Step = Annotated[int, Field(ge=0, le=1_000_000_000)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Record(_Msg):
    step: Step
    loss: Finite | None            # None: non-finite on the GPU (reported, never hidden)
    grad_norm: Finite | None
    clip_scale: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None
    lr: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    tokens_per_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    step_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    # GPU time of the optimizer phase (norm, clip, AdamW), where the adapter has timestamp-query.
    opt_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    eval_loss: Finite | None = None
    # Mean training loss per data source this step ({source index: loss}), for the bandit.
    source_losses: dict[Annotated[str, Field(max_length=8)], Finite] | None = Field(
        default=None, max_length=64)
    phase: Annotated[int, Field(ge=0)] | None = None


class Hello(_Msg):
    type: Literal["hello"]
    token: Annotated[str, Field(max_length=256)]
    last_acked_step: Step | None = None


class Metrics(_Msg):
    type: Literal["metrics"]
    records: Annotated[list[Record], Field(min_length=1, max_length=MAX_RECORDS)]


class Status(_Msg):
    type: Literal["status"]
    status: Literal["running", "paused", "finished", "stopped", "failed"]
    message: Annotated[str, Field(max_length=2000)] | None = None
    adapter: dict[Annotated[str, Field(max_length=64)],
                  Annotated[str, Field(max_length=256)] | bool | int | float] | None = None


class Sample(_Msg):
    type: Literal["sample"]
    step: Step
    text: Annotated[str, Field(max_length=MAX_SAMPLE_CHARS)]


class Ping(_Msg):
    type: Literal["ping"]


Message = TypeAdapter(Annotated[Union[Metrics, Status, Sample, Ping, Hello],
                                Field(discriminator="type")])


class ProtocolError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Viewer:
    """One watching socket's bounded queue; `dropped` once it fell too far behind."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=VIEWER_QUEUE)
        self.dropped = False


class Hub:
    """Per-run sets of viewers. Publishing never blocks: a full queue drops its viewer."""

    def __init__(self):
        self.viewers: dict[str, set[Viewer]] = {}
        self.trainers: dict[str, int] = {}   # open trainer sockets per run (after hello)

    def subscribe(self, run_id: str) -> Viewer:
        viewer = Viewer()
        self.viewers.setdefault(run_id, set()).add(viewer)
        return viewer

    def unsubscribe(self, run_id: str, viewer: Viewer) -> None:
        self.viewers.get(run_id, set()).discard(viewer)

    def publish(self, run_id: str, message: dict) -> None:
        for viewer in list(self.viewers.get(run_id, ())):
            try:
                viewer.queue.put_nowait(message)
            except asyncio.QueueFull:
                self.unsubscribe(run_id, viewer)
                viewer.dropped = True   # its socket drains what it has, then closes 1013


def _origin_ok(ws: WebSocket) -> bool:
    origin = ws.headers.get("origin")
    if origin is None:          # not a browser (CLI, tests): the token still guards writes
        return True
    allowed = ws.app.state.settings.allowed_origins
    host = ws.headers.get("host", "")
    return origin in allowed or origin == f"http://{host}"


async def _receive(ws: WebSocket):
    raw = await ws.receive()
    if raw["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(raw.get("code", 1000))
    text = raw.get("text")
    if text is None:
        data = raw.get("bytes") or b""
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError(1009, f"message of {len(data)} bytes is over {MAX_MESSAGE_BYTES}")
        raise ProtocolError(1003, "binary messages are not part of the protocol; send JSON text")
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError(1009, f"message of {len(text)} bytes is over {MAX_MESSAGE_BYTES}")
    try:
        return Message.validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ProtocolError(1003, f"invalid message at {where or 'top level'}: {first['msg']}")


async def _close(ws: WebSocket, code: int, message: str) -> None:
    try:
        await ws.send_json({"type": "error", "message": message})
        await ws.close(code=code, reason=message[:120])
    except Exception:  # the peer may already be gone
        pass


@router.websocket("/ws/runs/{run_id}")
async def trainer_socket(ws: WebSocket, run_id: str):
    app = ws.app
    store, hub = app.state.store, app.state.hub
    connected = False
    if not _origin_ok(ws):
        await ws.close(code=1008, reason="origin not allowed")
        return
    await ws.accept()
    try:
        hello = await asyncio.wait_for(_receive(ws), timeout=30)
        if not isinstance(hello, Hello):
            raise ProtocolError(1008, "the first message must be hello with the run's token")
        run = await store.run(store.get_run_with_token, run_id)
        if run is None:
            raise ProtocolError(1008, f"unknown run {run_id!r}")
        if not hmac.compare_digest(run["token_sha256"], token_hash(hello.token)):
            raise ProtocolError(1008, "wrong token for this run")
        await ws.send_json({"type": "welcome", "last_committed_step":
                            await store.run(store.last_step, run_id)})
        hub.trainers[run_id] = hub.trainers.get(run_id, 0) + 1
        connected = True
        while True:
            msg = await _receive(ws)
            if isinstance(msg, Metrics):
                records = [r.model_dump(exclude_none=True) | {"loss": r.loss} for r in msg.records]
                last = await store.run(store.add_metrics, run_id, records)
                await ws.send_json({"type": "ack", "step": last})
                hub.publish(run_id, {"type": "records", "records": records})
                app.state.runs_feedback(run_id, msg.records)
            elif isinstance(msg, Status):
                await store.run(store.set_status, run_id, msg.status, msg.message, msg.adapter)
                hub.publish(run_id, {"type": "run",
                                     "run": public_run(await store.run(store.get_run, run_id))})
            elif isinstance(msg, Sample):
                await store.run(store.add_event, run_id, msg.step, "sample", {"text": msg.text})
                hub.publish(run_id, {"type": "sample", "step": msg.step, "text": msg.text})
            elif isinstance(msg, Ping):
                await ws.send_json({"type": "pong"})
            else:
                raise ProtocolError(1008, "hello may only be sent once")
    except ProtocolError as e:
        await _close(ws, e.code, str(e))
    except asyncio.TimeoutError:
        await _close(ws, 1008, "no hello within 30 s")
    except WebSocketDisconnect:
        pass
    finally:
        if connected:
            hub.trainers[run_id] -= 1
            asyncio.get_running_loop().create_task(_mark_if_abandoned(app, run_id))


async def _mark_if_abandoned(app, run_id: str) -> None:
    """A running run whose training tab stays away past the grace period (closed, reloaded,
    crashed) is marked interrupted, so the list does not show it running forever. A trainer
    that comes back and reports 'running' flips it back."""
    await asyncio.sleep(app.state.settings.trainer_grace_s)
    store, hub = app.state.store, app.state.hub
    if hub.trainers.get(run_id, 0) > 0:
        return
    run = await store.run(store.get_run, run_id)
    if run and run["status"] in ("running", "paused"):
        message = "the training tab went away before the run ended"
        await store.run(store.set_status, run_id, "interrupted", message)
        hub.publish(run_id, {"type": "run",
                             "run": public_run(await store.run(store.get_run, run_id))})


@router.websocket("/ws/runs/{run_id}/watch")
async def viewer_socket(ws: WebSocket, run_id: str):
    store, hub = ws.app.state.store, ws.app.state.hub
    if not _origin_ok(ws):
        await ws.close(code=1008, reason="origin not allowed")
        return
    await ws.accept()
    run = await store.run(store.get_run, run_id)
    if run is None:
        await _close(ws, 1008, f"unknown run {run_id!r}")
        return
    viewer = hub.subscribe(run_id)  # before the backlog read, so nothing falls between them
    try:
        await ws.send_json({"type": "run", "run": public_run(run)})
        backlog = await store.run(store.metrics, run_id)
        for i in range(0, len(backlog), 1000):
            await ws.send_json({"type": "records", "records": backlog[i:i + 1000]})
        for ev in await store.run(store.events, run_id):
            await ws.send_json({"type": ev["kind"], **ev})
        while True:
            get = asyncio.ensure_future(viewer.queue.get())
            recv = asyncio.ensure_future(ws.receive())
            done, _ = await asyncio.wait({get, recv}, return_when=asyncio.FIRST_COMPLETED)
            if recv in done:
                get.cancel()
                if recv.result()["type"] == "websocket.disconnect":
                    return
                continue  # viewers have nothing to say; ignore
            recv.cancel()
            await ws.send_json(get.result())
            if viewer.dropped and viewer.queue.empty():
                await _close(ws, 1013, "viewer too slow; reconnect to resume from the backlog")
                return
    except WebSocketDisconnect:
        pass
    finally:
        hub.unsubscribe(run_id, viewer)
