"""Websocket telemetry: the training tab streams step records (metrics.Record), the server
validates, commits to SQLite, acks, and fans committed records out to read-only viewers.

Trainer (`/ws/runs/{id}`), client -> server:
  {"type": "hello", "token": str, "last_acked_step": int | null}   first message, always
  {"type": "metrics", "records": [Record, ...]}                     batched, ~every 250 ms
  {"type": "status", "status": "running" | "paused" | "finished" | "stopped" | "failed",
   "message"?: str, "adapter"?: {...}}
  {"type": "sample", "step": int, "text": str}                      generated text
  {"type": "ping"}
server -> client: welcome {last_committed_step, records_per_message}, ack {step}, pong,
error {message}. A trainer sends at most records_per_message records per metrics message.
Viewers (`/ws/runs/{id}/watch`) get {"type": "records", "records": [...]} (backlog first),
{"type": "run", "run": {...}} on status changes, {"type": "sample", ...}, and
{"type": "resumed", "step": K} when a tab takes the run over from checkpoint K (the records
after K are deleted: drop them). One trainer per run: a second hello while one is connected is
refused, and so is the token a resume revoked (routes/checkpoints.py).
Close codes: 1003 bad data, 1008 policy (origin, token, revoked token, the run already has a
trainer, unknown run), 1009 too big, 1013 a viewer too slow to keep up (it reconnects and gets
the backlog).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Literal, Union

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from andrea.config import Settings
from andrea.data.runs import RunRegistry
from andrea.deps import REVOKED, FanoutDep, RunsDep, SettingsDep, StoreDep
from andrea.fanout import Fanout
from andrea.metrics import Record, Step
from andrea.run_info import TrainerStatus, public_run
from andrea.store import Store

log = logging.getLogger("andrea.telemetry")
router = APIRouter()

MAX_MESSAGE_BYTES = 1 << 20      # one metrics batch; a step record is ~200 bytes
# Records per metrics message a trainer sends (told in welcome): ~100 KiB, far below the limit.
RECORDS_PER_MESSAGE = 500
MAX_RECORDS = 4 * RECORDS_PER_MESSAGE   # accepted per message
BACKLOG_CHUNK = 1000             # records per message of a viewer's backlog
MAX_SAMPLE_CHARS = 20_000
HELLO_TIMEOUT_S = 30


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Hello(_Msg):
    type: Literal["hello"]
    token: Annotated[str, Field(max_length=256)]
    last_acked_step: Step | None = None


class Metrics(_Msg):
    type: Literal["metrics"]
    records: Annotated[list[Record], Field(min_length=1, max_length=MAX_RECORDS)]


class Status(_Msg):
    type: Literal["status"]
    status: TrainerStatus
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


def _origin_ok(ws: WebSocket, settings: Settings) -> bool:
    origin = ws.headers.get("origin")
    if origin is None:          # not a browser (CLI, tests): the token still guards writes
        return True
    host = ws.headers.get("host", "")
    return origin in settings.allowed_origins or origin == f"http://{host}"


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


def _feed_bandit(runs: RunRegistry, run_id: str, records: list[Record]) -> None:
    # Every record counts, also one without usable losses: the bandit's next phase waits for
    # every step of the phases it depends on (data/bandit.py).
    for r in records:
        runs.report_losses(run_id, r.step, r.source_losses or {})


@router.websocket("/ws/runs/{run_id}")
async def trainer_socket(ws: WebSocket, run_id: str, store: StoreDep, fanout: FanoutDep,
                         runs: RunsDep, settings: SettingsDep):
    connected = False
    if not _origin_ok(ws, settings):
        await ws.close(code=1008, reason="origin not allowed")
        return
    await ws.accept()
    try:
        hello = await asyncio.wait_for(_receive(ws), timeout=HELLO_TIMEOUT_S)
        if not isinstance(hello, Hello):
            raise ProtocolError(1008, "the first message must be hello with the run's token")
        async with fanout.run_lock(run_id):   # a resume cannot revoke between check and join
            verdict = await store.run(store.check_token, run_id, hello.token)
            if verdict is None:
                raise ProtocolError(1008, f"unknown run {run_id!r}")
            if verdict == "revoked":
                raise ProtocolError(1008, REVOKED)
            if verdict != "ok":
                raise ProtocolError(1008, "wrong token for this run")
            if fanout.has_trainer(run_id):
                raise ProtocolError(1008, "another trainer holds this run")
            fanout.trainer_joined(run_id)
            connected = True
        await ws.send_json({"type": "welcome", "records_per_message": RECORDS_PER_MESSAGE,
                            "last_committed_step": await store.run(store.last_step, run_id)})
        while True:
            msg = await _receive(ws)
            if isinstance(msg, Metrics):
                records = [r.row() for r in msg.records]
                last = await store.run(store.add_metrics, run_id, records)
                await ws.send_json({"type": "ack", "step": last})
                fanout.publish(run_id, {"type": "records", "records": records})
                try:    # off the loop: a bandit being made replays the store under its lock
                    await asyncio.to_thread(_feed_bandit, runs, run_id, msg.records)
                except ValueError as e:
                    raise ProtocolError(1003, f"source_losses: {e}") from None
            elif isinstance(msg, Status):
                await store.run(store.set_status, run_id, msg.status, msg.message, msg.adapter)
                fanout.publish(run_id, {"type": "run", "run": public_run(
                    await store.run(store.get_run, run_id), True)})
            elif isinstance(msg, Sample):
                await store.run(store.add_event, run_id, msg.step, "sample", {"text": msg.text})
                fanout.publish(run_id, {"type": "sample", "step": msg.step, "text": msg.text})
            elif isinstance(msg, Ping):
                await ws.send_json({"type": "pong"})
            else:
                raise ProtocolError(1008, "hello may only be sent once")
    except ProtocolError as e:
        await _close(ws, e.code, str(e))
    except asyncio.TimeoutError:
        await _close(ws, 1008, f"no hello within {HELLO_TIMEOUT_S} s")
    except WebSocketDisconnect:
        pass
    finally:
        if connected:
            fanout.trainer_left(run_id)
            fanout.spawn(_publish_run(store, fanout, run_id))   # can_resume may be true now
            fanout.spawn(_mark_if_abandoned(store, fanout, settings.trainer_grace_s, run_id))


async def _publish_run(store: Store, fanout: Fanout, run_id: str) -> None:
    run = await store.run(store.get_run, run_id)
    if run is not None:
        fanout.publish(run_id, {"type": "run", "run": public_run(run, fanout.has_trainer(run_id))})


def watch_resumed(store: Store, fanout: Fanout, grace_s: float, run_id: str) -> None:
    """A resumed run is `created` until its new tab reports; if that tab never comes (closed
    while loading the checkpoint), the run is marked interrupted again, so it can be resumed
    once more instead of staying `created` for good."""
    fanout.spawn(_mark_if_abandoned(
        store, fanout, grace_s, run_id, ("created",),
        "the tab that resumed this run went away before it trained"))


ABANDONED = "the training tab went away before the run ended"


async def _mark_if_abandoned(store: Store, fanout: Fanout, grace_s: float, run_id: str,
                             statuses: tuple[str, ...] = ("running", "paused"),
                             message: str = ABANDONED) -> None:
    """A running run whose training tab stays away past the grace period (closed, reloaded,
    crashed) is marked interrupted, so the list does not show it running forever. A trainer
    that comes back and reports 'running' flips it back."""
    await asyncio.sleep(grace_s)
    if fanout.has_trainer(run_id):
        return
    run = await store.run(store.get_run, run_id)
    if run and run["status"] in statuses:
        await store.run(store.set_status, run_id, "interrupted", message)
        fanout.publish(run_id, {"type": "run", "run": public_run(
            await store.run(store.get_run, run_id), fanout.has_trainer(run_id))})


@router.websocket("/ws/runs/{run_id}/watch")
async def viewer_socket(ws: WebSocket, run_id: str, store: StoreDep, fanout: FanoutDep,
                        settings: SettingsDep):
    if not _origin_ok(ws, settings):
        await ws.close(code=1008, reason="origin not allowed")
        return
    await ws.accept()
    run = await store.run(store.get_run, run_id)
    if run is None:
        await _close(ws, 1008, f"unknown run {run_id!r}")
        return
    viewer = fanout.subscribe(run_id)  # before the backlog read, so nothing falls between them
    try:
        await ws.send_json({"type": "run", "run": public_run(run, fanout.has_trainer(run_id))})
        backlog = await store.run(store.metrics, run_id)
        for i in range(0, len(backlog), BACKLOG_CHUNK):
            await ws.send_json({"type": "records", "records": backlog[i:i + BACKLOG_CHUNK]})
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
        fanout.unsubscribe(run_id, viewer)
