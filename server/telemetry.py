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
Steps are those of the run: 0 .. its `steps`. A finished or failed run stays so: only
POST /api/runs/{id}/resume (a checkpoint) or a branch trains it again.

Viewers (`/ws/runs/{id}/watch[?after=N]`) get {"type": "records", "records": [...]} (the
backlog after step N first, streamed from the store in pages, then live), {"type": "run",
"run": {...}} on status changes and when the run's trainer goes or comes back (its
`connected`), {"type": "sample", ...}, and {"type": "resumed", "step": K}
when a tab takes the run over from checkpoint K (the records after K are deleted: drop them;
a reconnect with ?after=N past a resume gets that too, and the records after K again). Viewers
are sent exactly what the store committed (first write wins). A viewer may send
{"type": "from", "step": N} (resend everything after N) or {"type": "ping"}; nothing else, and
nothing big (1009). One that falls more than Settings.viewer_queue_bytes behind is closed 1013
(it reconnects with ?after=its last step); a send that does not complete within
Settings.viewer_send_timeout_s frees the connection.

One trainer per run: a second hello while one is connected is refused, and so is the token a
resume revoked (routes/checkpoints.py).
Close codes (an error message comes first): 1003 bad data, 1008 policy (origin, token, revoked
token, the run already has a trainer, unknown run, a finished run), 1009 too big, 1013 try
again later (a viewer too slow to keep up; the server cannot store records: full disk,
read-only data dir — the trainer keeps its unacked records and reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Annotated, Literal, Union

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from andrea.broker import BrokerUnavailable
from andrea.config import Settings, host_of
from andrea.data.runs import RunRegistry
from andrea.deps import REVOKED, FanoutDep, RunsDep, SettingsDep, StoreDep
from andrea.fanout import Fanout, Outgoing, Viewer
from andrea.metrics import Record, Step
from andrea.run_info import TrainerStatus, public_run
from andrea.store import Store, StoreUnavailable

log = logging.getLogger("andrea.telemetry")
router = APIRouter()

MAX_MESSAGE_BYTES = 1 << 20      # one metrics batch (UTF-8 bytes); a step record is ~200 bytes
# Frames past this are refused by the websocket layer itself (close 1009) where the server
# lets us set it (uvicorn's websockets-sansio); between the two, the error message comes first.
TRAINER_FRAME_BYTES = 2 * MAX_MESSAGE_BYTES
VIEWER_MESSAGE_BYTES = 4096      # a viewer only ever says "from" or "ping"
# Records per metrics message a trainer sends (told in welcome): ~100 KiB, far below the limit.
RECORDS_PER_MESSAGE = 500
MAX_RECORDS = 4 * RECORDS_PER_MESSAGE   # accepted per message
BACKLOG_PAGE = 256               # records per message of a viewer's backlog (~60 KiB)
EVENTS_PAGE = 16                 # events (samples of up to 20k chars) per backlog read
MAX_SAMPLE_CHARS = 20_000
MAX_ADAPTER_KEYS = 32
HELLO_TIMEOUT_S = 30
# Statuses a trainer's message cannot change (only a resume or a branch trains such a run).
FINAL = ("finished", "failed")


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


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
    adapter: Annotated[dict[Annotated[str, Field(max_length=64)],
                            Annotated[str, Field(max_length=256)] | bool | int | float],
                       Field(max_length=MAX_ADAPTER_KEYS)] | None = None


class Sample(_Msg):
    type: Literal["sample"]
    step: Step
    text: Annotated[str, Field(max_length=MAX_SAMPLE_CHARS)]


class Ping(_Msg):
    type: Literal["ping"]


class From(_Msg):
    """A viewer's: send everything after `step` again (what it has lost track of)."""
    type: Literal["from"]
    step: Annotated[int, Field(ge=-1, le=1_000_000_000)]


Message = TypeAdapter(Annotated[Union[Metrics, Status, Sample, Ping, Hello],
                                Field(discriminator="type")])
ViewerMessage = TypeAdapter(Annotated[Union[From, Ping], Field(discriminator="type")])


class ProtocolError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _origin_ok(ws: WebSocket, settings: Settings) -> bool:
    """A browser's Origin must be one of the allowed hosts on this server's port (the Host
    header has been checked against the same list by app.HostCheck); a client without an
    Origin (CLI, tests) is no page, and the token still guards writes."""
    origin = ws.headers.get("origin")
    if origin is None:
        return True
    _, port = host_of(ws.headers.get("host", ""))
    return settings.origin_allowed(origin, port or settings.port)


def _protocol(ws: WebSocket):
    """uvicorn's protocol object behind the socket (websockets-sansio), when reachable: it lets
    us set a per-socket frame limit and abort a connection whose peer stopped reading."""
    proto = getattr(ws._receive, "__self__", None)
    if hasattr(proto, "transport") and hasattr(getattr(proto, "conn", None),
                                               "max_message_size"):
        return proto
    return None


def _limit_frames(ws: WebSocket, max_bytes: int) -> None:
    """Messages over max_bytes are refused by the websocket layer (close 1009), never
    buffered whole. (The first frame may still be checked against the server's own limit;
    _receive checks every message again.)"""
    proto = _protocol(ws)
    if proto is not None:
        proto.conn.max_message_size = max_bytes


def _abort(ws: WebSocket) -> None:
    """Frees a connection at once, whatever is still buffered for a peer that stopped reading
    (a close would wait for the buffer to drain, for ever)."""
    proto = _protocol(ws)
    if proto is not None:
        proto.transport.abort()


def _text_of(raw: dict, limit: int) -> str:
    if raw["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(raw.get("code", 1000))
    text = raw.get("text")
    if text is None:
        data = raw.get("bytes") or b""
        if len(data) > limit:
            raise ProtocolError(1009, f"message of {len(data)} bytes is over {limit}")
        raise ProtocolError(1003, "binary messages are not part of the protocol; send JSON text")
    # Bytes, not characters: a character is up to 4 bytes (counted only when it matters).
    size = len(text) if len(text) * 4 <= limit else len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ProtocolError(1009, f"message of {size} bytes is over {limit}")
    return text


def _parse(adapter: TypeAdapter, text: str):
    try:
        return adapter.validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ProtocolError(1003, f"invalid message at {where or 'top level'}: {first['msg']}")


async def _receive(ws: WebSocket):
    return _parse(Message, _text_of(await ws.receive(), MAX_MESSAGE_BYTES))


async def _close(ws: WebSocket, code: int, message: str, timeout: float = 5.0) -> None:
    """The error message, then the close; a peer that does not take them in time is cut off."""
    try:
        await asyncio.wait_for(ws.send_json({"type": "error", "message": message}), timeout)
        await asyncio.wait_for(ws.close(code=code, reason=message[:120]), timeout)
    except asyncio.TimeoutError:
        _abort(ws)
    except Exception:  # the peer may already be gone
        pass


def _feed_bandit(runs: RunRegistry, run_id: str, records: list[Record]) -> None:
    # Every record counts, also one without usable losses: the bandit's next phase waits for
    # every step of the phases it depends on (data/bandit.py).
    for r in records:
        runs.report_losses(run_id, r.step, r.source_losses or {})


def _check_steps(steps: int, *values: int | None) -> None:
    """Steps of a record, sample or hello are the run's: 0 .. steps."""
    bad = [v for v in values if v is not None and v > steps]
    if bad:
        raise ProtocolError(1003, f"step {max(bad)} is beyond this run's {steps} steps")


@router.websocket("/ws/runs/{run_id}")
async def trainer_socket(ws: WebSocket, run_id: str, store: StoreDep, fanout: FanoutDep,
                         runs: RunsDep, settings: SettingsDep):
    connected = False
    if not _origin_ok(ws, settings):
        await ws.close(code=1008, reason="origin not allowed")
        return
    _limit_frames(ws, TRAINER_FRAME_BYTES)
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
            if not await fanout.claim_trainer(run_id):
                raise ProtocolError(1008, "another trainer holds this run")
            connected = True
        run = await store.run(store.get_run, run_id)
        if run["status"] in ("running", "paused"):
            # A tab back after a dropped connection: its viewers said "no training tab".
            fanout.publish(run_id, {"type": "run", "run": public_run(run, True)})
        steps = run["config"]["steps"]
        _check_steps(steps, hello.last_acked_step)
        await ws.send_json({"type": "welcome", "records_per_message": RECORDS_PER_MESSAGE,
                            "last_committed_step": run["last_step"]})
        while True:
            msg = await _receive(ws)
            if isinstance(msg, Metrics):
                _check_steps(steps, *(r.step for r in msg.records))
                inserted, last = await store.add_metrics_grouped(
                    run_id, [r.row() for r in msg.records])
                await ws.send_json({"type": "ack", "step": last})
                if inserted:    # exactly what was committed; a resend changes nothing
                    fanout.publish(run_id, {"type": "records", "records": inserted})
                if runs.has_bandit(run_id):   # (most runs have none: no thread trip)
                    try:    # off the loop: a bandit being made replays the store under its lock
                        await asyncio.to_thread(_feed_bandit, runs, run_id, msg.records)
                    except ValueError as e:
                        raise ProtocolError(1003, f"source_losses: {e}") from None
            elif isinstance(msg, Status):
                now = await store.run(store.set_status, run_id, msg.status, msg.message,
                                      msg.adapter, FINAL)
                if now != msg.status:
                    raise ProtocolError(1008, f"the run is {now}: a trainer cannot make it "
                                              f"{msg.status} again (resume it from a checkpoint"
                                              f" with POST /api/runs/{run_id}/resume, or branch)")
                fanout.publish(run_id, {"type": "run", "run": public_run(
                    await store.run(store.get_run, run_id), True)})
            elif isinstance(msg, Sample):
                _check_steps(steps, msg.step)
                await store.run(store.add_event, run_id, msg.step, "sample", {"text": msg.text})
                fanout.publish(run_id, {"type": "sample", "step": msg.step, "text": msg.text})
            elif isinstance(msg, Ping):
                await ws.send_json({"type": "pong"})
            else:
                raise ProtocolError(1008, "hello may only be sent once")
    except ProtocolError as e:
        await _close(ws, e.code, str(e))
    except StoreUnavailable as e:   # the page keeps its unacked records and comes back
        log.error("run %s: %s", run_id, e)
        await _close(ws, 1013, f"{e}; the records not acknowledged are kept: free space or "
                               "fix the data dir, the page reconnects")
    except BrokerUnavailable as e:  # the other processes cannot be asked: come back later
        log.error("run %s: %s", run_id, e)
        await _close(ws, 1013, str(e))
    except asyncio.TimeoutError:
        await _close(ws, 1008, f"no hello within {HELLO_TIMEOUT_S} s")
    except WebSocketDisconnect:
        pass
    finally:
        if connected:
            await fanout.release_trainer(run_id)
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
    try:
        if await fanout.trainer_anywhere(run_id):
            return
    except BrokerUnavailable:
        return      # cannot tell: leave it; the next trainer or watchdog decides
    run = await store.run(store.get_run, run_id)
    if run and run["status"] in statuses:
        await store.run(store.set_status, run_id, "interrupted", message)
        fanout.publish(run_id, {"type": "run", "run": public_run(
            await store.run(store.get_run, run_id), fanout.has_trainer(run_id))})


class _Gone(Exception):
    """The viewer went away, or sent what closes it (handled already)."""


class _ViewerSession:
    """One viewer socket: a reader task (it must always read, or a peer's messages would pile
    up) and the sending side, which streams the backlog from the store in pages and then the
    live queue, each send under a deadline."""

    def __init__(self, ws: WebSocket, run_id: str, store: Store, fanout: Fanout,
                 settings: Settings, after: int | None):
        self.ws, self.run_id, self.store, self.fanout = ws, run_id, store, fanout
        self.timeout = settings.viewer_send_timeout_s
        self.cursor = -1 if after is None else after   # the viewer has every record up to it
        self.event_cursor: tuple[int, str] = (self.cursor, "\uffff")
        self.restart: int | None = None                # a "from" asked for while live
        self.viewer: Viewer | None = None
        self.wake = asyncio.Event()     # the live queue's and the reader's: one wait, no tasks

    async def send(self, text: str) -> None:
        try:
            async with asyncio.timeout(self.timeout):   # (wait_for would make a task per send)
                await self.ws.send_text(text)
        except TimeoutError:
            _abort(self.ws)       # a peer that stopped reading: freed now
            raise _Gone() from None
        except (WebSocketDisconnect, RuntimeError, OSError):
            raise _Gone() from None

    async def read(self) -> None:
        """Reads every message the viewer sends; returns when it leaves, raises ProtocolError
        for one that breaks the protocol."""
        while True:
            msg = _parse(ViewerMessage, _text_of(await self.ws.receive(), VIEWER_MESSAGE_BYTES))
            if isinstance(msg, From):
                self.restart = msg.step
                self.wake.set()
            else:
                await self.send(json.dumps({"type": "pong"}))

    async def backlog(self) -> None:
        """Records after the cursor, then events after it, page by page from the store; live
        messages are queued (bounded) from the moment the store has been read to the end."""
        subscribed = False
        while True:
            text, last, n = await self.store.run(self.store.records_page_json, self.run_id,
                                                 self.cursor, BACKLOG_PAGE)
            if n:
                await self.send(text)
                self.cursor = last
            if n < BACKLOG_PAGE:
                if subscribed:
                    break
                # Nothing can fall between: whatever is committed after this point is
                # published to the queue, and one more read picks up what came before.
                self.viewer = self.fanout.subscribe(self.run_id,
                                                    self.fanout.new_viewer(self.wake))
                subscribed = True
        while True:
            events = await self.store.run(self.store.events_page, self.run_id,
                                          self.event_cursor, EVENTS_PAGE)
            for ev in events:
                await self.send(json.dumps({"type": ev["kind"], **ev}))
                self.event_cursor = (ev["step"], ev["kind"])
            if len(events) < EVENTS_PAGE:
                break

    async def start_from(self, after: int | None) -> None:
        """Sets the cursor to `after`, or to the first resume before it: the viewer may hold
        records that a resume replaced, so it drops them (a live-style "resumed") and gets
        them again."""
        if self.viewer is not None:
            self.fanout.unsubscribe(self.run_id, self.viewer)
            self.viewer = None
        if after is not None and after >= 0:
            resumed = await self.store.run(self.store.first_resume_after, self.run_id, after)
            if resumed is not None:
                await self.send(json.dumps({"type": "resumed", "step": resumed}))
                after = resumed
        self.cursor = -1 if after is None else after
        self.event_cursor = (self.cursor, "\uffff") if after is not None and after >= 0 \
            else (-1, "")
        await self.backlog()

    async def live(self) -> None:
        viewer = self.viewer
        while True:
            if viewer.resync and self.restart is None:
                self.restart = self.cursor      # the broker was away: the store has it all
            if self.restart is not None:
                step, self.restart = self.restart, None
                await self.start_from(step)
                viewer = self.viewer
            if viewer.dropped:
                await _close(self.ws, 1013, "viewer too slow: more than "
                             f"{viewer.max_bytes} bytes behind; reconnect with "
                             f"?after={self.cursor} to resume after step {self.cursor}",
                             self.timeout)
                raise _Gone()
            item = viewer.pop(self.cursor)
            if item is None:
                self.wake.clear()
                if self.restart is None and not viewer.resync and not viewer.dropped \
                        and not viewer.items:
                    await self.wake.wait()
                continue
            await self.deliver(item)

    async def deliver(self, item: Outgoing) -> None:
        if item.type == "records":
            if item.last is not None and item.last <= self.cursor:
                return          # read from the store already
            if item.first is not None and item.first > self.cursor + 1 >= 1:
                # A hole before it: a message was lost on its way from another process
                # (the broker reconnected). The store has every committed record.
                self.restart = self.cursor
                return
            await self.send(item.text)
            self.cursor = max(self.cursor, item.last or self.cursor)
            return
        if item.type == "resumed" and item.step is not None:
            self.cursor = min(self.cursor, item.step)
        await self.send(item.text)


@router.websocket("/ws/runs/{run_id}/watch")
async def viewer_socket(ws: WebSocket, run_id: str, store: StoreDep, fanout: FanoutDep,
                        settings: SettingsDep):
    if not _origin_ok(ws, settings):
        await ws.close(code=1008, reason="origin not allowed")
        return
    _limit_frames(ws, VIEWER_MESSAGE_BYTES)
    await ws.accept()
    raw_after = ws.query_params.get("after")
    if raw_after is not None and not (raw_after.isdigit() and len(raw_after) <= 10):
        await _close(ws, 1003, f"after must be a step (a non-negative integer), got "
                               f"{raw_after[:20]!r}")
        return
    try:
        run = await store.run(store.get_run, run_id)
    except StoreUnavailable as e:
        await _close(ws, 1013, str(e))
        return
    if run is None:
        await _close(ws, 1008, f"unknown run {run_id!r}")
        return
    session = _ViewerSession(ws, run_id, store, fanout, settings,
                             None if raw_after is None else int(raw_after))
    reader = asyncio.ensure_future(session.read())

    async def write():
        await session.send(json.dumps({"type": "run", "run": public_run(
            run, fanout.has_trainer(run_id))}))
        await session.start_from(session.cursor if raw_after is not None else None)
        await session.live()

    writer = asyncio.ensure_future(write())
    try:
        done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            e = task.exception()
            if isinstance(e, ProtocolError):
                writer.cancel()
                with contextlib.suppress(BaseException):
                    await writer
                await _close(ws, e.code, str(e), session.timeout)
            elif isinstance(e, StoreUnavailable):
                writer.cancel()
                await _close(ws, 1013, str(e), session.timeout)
            elif e is not None and not isinstance(e, (_Gone, WebSocketDisconnect)):
                raise e
    finally:
        # Cancelled, not awaited: the handler returns at once (its tasks end on their own,
        # their outcome retrieved so none is reported as lost).
        for task in (reader, writer):
            task.cancel()
            task.add_done_callback(_retrieve)
        if session.viewer is not None:
            fanout.unsubscribe(run_id, session.viewer)


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
