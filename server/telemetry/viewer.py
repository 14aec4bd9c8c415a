"""The viewer socket, `/ws/runs/{id}/watch[?after=N]`: read-only, any number per run
(protocol.py has its messages). A session streams the run's backlog from the store in pages,
then the live messages fanout.py queues for it (bounded: one too slow is closed 1013), each
send under a deadline (Settings.viewer_send_timeout_s).

What readers may cost is bounded per client address (quotas.py, in this process): at most
Settings.max_viewers_per_client sockets open (more are closed 1008), and the backlog bytes read
from the store, viewer_backlog_burst_bytes and then viewer_backlog_bytes_per_s for all of its
sockets together (past it each page waits for the budget: re-reading a run from step -1 in a
loop, or reconnecting, is sent more slowly and cannot crowd out the trainers' commits). Live
messages are not counted: fanout.py encodes them once for every viewer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import weakref

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from andrea.config import Settings
from andrea.errors import MALFORMED, NOT_FOUND, TOO_OFTEN, UNAVAILABLE
from andrea.fanout import Fanout, Outgoing, Viewer
from andrea.runs.info import public_run, run_message
from andrea.runs.lifecycle import current_run
from andrea.store import Store, StoreUnavailable
from andrea.telemetry.protocol import (
    VIEWER_MESSAGE_BYTES,
    From,
    ProtocolError,
    ViewerMessage,
    accept,
    receive,
    refuse,
)
from andrea.telemetry.uvicorn_shim import abort
from andrea.web.deps import FanoutDep, SettingsDep, StoreDep
from andrea.web.quotas import ClientSlots, RateLimiter, TokenBucket, app_state

router = APIRouter()

BACKLOG_PAGE = 256               # records per message of a viewer's backlog (~60 KiB)
EVENTS_PAGE = 16                 # events (samples of up to 20k chars) per backlog read


class _Gone(Exception):
    """The viewer went away, or sent what closes it (handled already)."""


class _ViewerSession:
    """One viewer socket: a reader task (it must always read, or a peer's messages would pile
    up) and the sending side, which streams the backlog from the store in pages and then the
    live queue, each send under a deadline."""

    def __init__(self, ws: WebSocket, run_id: str, store: Store, fanout: Fanout,
                 settings: Settings, after: int | None, budget: TokenBucket,
                 read_lock: asyncio.Lock):
        self.ws, self.run_id, self.store, self.fanout = ws, run_id, store, fanout
        self.budget = budget            # the client address's backlog bytes (all its sockets)
        # The address's backlog reads, one page at a time: a page is read and encoded holding
        # the GIL (~3 ms for 60 KiB), so a dozen of one address's viewers at once would hold
        # every trainer's ack behind a dozen pages; one at a time, behind one.
        self.read_lock = read_lock
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
            abort(self.ws)        # a peer that stopped reading: freed now
            raise _Gone() from None
        except (WebSocketDisconnect, RuntimeError, OSError):
            raise _Gone() from None

    async def pace(self, n: int) -> None:
        """`n` backlog bytes sent: taken from the client's budget; past it, the next read waits
        until the budget is back (the debt paid)."""
        wait = self.budget.take(n)
        if wait > 0:
            await asyncio.sleep(wait)

    async def read(self) -> None:
        """Reads every message the viewer sends; returns when it leaves, raises ProtocolError
        for one that breaks the protocol."""
        while True:
            msg = await receive(self.ws, ViewerMessage, VIEWER_MESSAGE_BYTES)
            if isinstance(msg, From):
                self.restart = msg.step
                self.wake.set()
            else:
                await self.send(json.dumps({"type": "pong"}))

    async def backlog(self) -> None:
        """Records after the cursor, then events after it, page by page from the store; live
        messages are queued (bounded) from the moment the store has been read to the end. A
        resume meanwhile (its live message may have reached no queue of this viewer) is told
        as a live one, and the records after it are read again."""
        resumes = await self.store.run(self.store.events.resume_count, self.run_id)
        subscribed = False
        while True:
            async with self.read_lock:      # one page at a time per address (see __init__)
                text, last, n = await self.store.run(self.store.metrics.page_json,
                                                     self.run_id, self.cursor, BACKLOG_PAGE)
            if n:
                await self.send(text)
                self.cursor = last
                await self.pace(len(text))
            if n < BACKLOG_PAGE:
                if subscribed:
                    now = await self.store.run(self.store.events.resume_count, self.run_id)
                    if now == resumes:
                        break
                    # Resumed while the pages were read: its live message may have come
                    # before the subscription. The records after its step were replaced.
                    resumes = now
                    resumed = await self.store.run(self.store.events.first_resume_after,
                                                   self.run_id, self.cursor)
                    if resumed is not None:
                        await self.send(json.dumps({"type": "resumed", "step": resumed}))
                        self.cursor = resumed
                    continue
                # Nothing can fall between: whatever is committed after this point is
                # published to the queue, and one more read picks up what came before.
                self.viewer = self.fanout.subscribe(self.run_id,
                                                    self.fanout.new_viewer(self.wake))
                subscribed = True
        while True:
            async with self.read_lock:
                events = await self.store.run(self.store.events.page, self.run_id,
                                              self.event_cursor, EVENTS_PAGE)
            for ev in events:
                text = json.dumps({"type": ev["kind"], **ev})
                await self.send(text)
                self.event_cursor = (ev["step"], ev["kind"])
                await self.pace(len(text))
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
            resumed = await self.store.run(self.store.events.first_resume_after, self.run_id, after)
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
                await refuse(self.ws, ProtocolError(
                    UNAVAILABLE, f"viewer too slow: more than {viewer.max_bytes} bytes behind; "
                    f"reconnect with ?after={self.cursor} to resume after step {self.cursor}"),
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
    if not await accept(ws, settings, VIEWER_MESSAGE_BYTES):
        return
    raw_after = ws.query_params.get("after")
    # ASCII digits alone: str.isdigit() also takes "²", which int() refuses.
    if raw_after is not None and not re.fullmatch(r"[0-9]{1,10}", raw_after):
        await refuse(ws, ProtocolError(MALFORMED, "after must be a step (a non-negative "
                                                  f"integer), got {raw_after[:20]!r}"))
        return
    client = ws.client.host if ws.client else ""
    release = app_state(ws.app, "viewer_slots",
                        lambda: ClientSlots(settings.max_viewers_per_client)).take(client)
    if release is None:
        await refuse(ws, ProtocolError(TOO_OFTEN, f"too many viewer sockets from {client}: "
                                                  f"{settings.max_viewers_per_client} at once "
                                                  "(ANDREA_MAX_VIEWERS_PER_CLIENT); close some "
                                                  "run pages, then reload this one"),
                     settings.viewer_send_timeout_s)
        return
    try:
        run = await store.run(store.runs.get, run_id)
    except StoreUnavailable as e:
        release()
        await refuse(ws, e)
        return
    if run is None:
        release()
        await refuse(ws, ProtocolError(NOT_FOUND, f"unknown run {run_id!r}"))
        return
    reads = app_state(ws.app, "viewer_reads", lambda: RateLimiter(
        settings.viewer_backlog_burst_bytes, settings.viewer_backlog_bytes_per_s))
    locks = app_state(ws.app, "viewer_read_locks", weakref.WeakValueDictionary)
    if (read_lock := locks.get(client)) is None:    # (kept while a session of it holds it)
        read_lock = locks[client] = asyncio.Lock()
    session = _ViewerSession(ws, run_id, store, fanout, settings,
                             None if raw_after is None else int(raw_after), reads.bucket(client),
                             read_lock)
    reader = asyncio.ensure_future(session.read())

    async def write():
        shown = public_run(run, fanout.has_trainer(run_id))
        await session.send(json.dumps(run_message(shown)))
        await session.start_from(session.cursor if raw_after is not None else None)
        # A status change published between that message and the subscription (start_from)
        # reached no queue: the run as it is now, if its status differs. (Only the status: a
        # trainer's hello on a run not yet running changes `connected` and publishes nothing.)
        now = await current_run(store, fanout, run_id)
        if now is not None and now["status"] != shown["status"]:
            await session.send(json.dumps(run_message(now)))
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
                await refuse(ws, e, session.timeout)
            elif isinstance(e, StoreUnavailable):
                writer.cancel()
                await refuse(ws, e, session.timeout)
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
        release()


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
