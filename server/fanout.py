"""Live runs: which viewer sockets watch a run, which runs have their trainer socket (THE
registry of "connected": telemetry, can_resume and resume all ask here), the per-run lock
that orders trainer hellos, resumes, branches and checkpoint commits, and the watchdog tasks
that mark a run interrupted when its trainer stays away (runs/lifecycle.py).

A published message is encoded to JSON once and the same text is queued for every viewer;
each viewer's queue is bounded in bytes: one that falls further behind is dropped at once (its
queue freed) and its socket closes 1013, so a slow or silent viewer never holds more than its
budget, however long it stays. Records messages waiting in one queue go out as one message.

With a broker (broker.py, Redis) the same holds across server processes: published messages
reach the viewers of every process, a trainer on any process counts as connected, and run
locks are taken across processes too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from andrea.broker import RedisBroker
from andrea.config import VIEWER_QUEUE_BYTES  # bytes buffered per viewer before it is dropped

VIEWER_QUEUE_MESSAGES = 1024     # and messages per viewer (each costs a little besides its text)


@dataclass(frozen=True)
class Outgoing:
    """One published message: its JSON text, shared by every viewer, and what it is about."""
    text: str
    type: str
    first: int | None = None     # "records": the lowest and highest step it carries
    last: int | None = None
    step: int | None = None      # "resumed": the checkpoint step

    @property
    def size(self) -> int:
        return len(self.text) + 64

    @classmethod
    def of(cls, message: dict, text: str | None = None) -> "Outgoing":
        """`text`: the message as JSON already (from another process)."""
        kind = message.get("type", "")
        if text is None and kind == "records":
            text = records_text([json.dumps(message["records"], allow_nan=False,
                                            separators=(",", ":"))[1:-1]])
        if text is None:
            text = json.dumps(message, allow_nan=False, separators=(",", ":"))
        if kind == "records" and message.get("records"):
            steps = [r["step"] for r in message["records"]]
            return cls(text, kind, min(steps), max(steps))
        return cls(text, kind, step=message.get("step"))

    @classmethod
    def parse(cls, text: str) -> "Outgoing":
        return cls.of(json.loads(text), text)

    def records_body(self) -> str:
        """The records array's inside ("{...},{...}"), for merging messages: records messages
        are always written by records_text."""
        return self.text[len(_RECORDS_HEAD):-2]


_RECORDS_HEAD = '{"type":"records","records":['


def records_text(bodies: list[str]) -> str:
    """{"type": "records", "records": [...]} from the inside of one or more record arrays."""
    return _RECORDS_HEAD + ",".join(bodies) + "]}"


class Viewer:
    """One watching socket's queue, bounded in bytes; `dropped` once it fell too far behind
    (the queue is emptied then: nothing waits for a viewer that will be closed)."""

    def __init__(self, max_bytes: int = VIEWER_QUEUE_BYTES, wake: asyncio.Event | None = None):
        self.max_bytes = max_bytes
        self.items: deque[Outgoing] = deque()
        self.bytes = 0
        self.dropped = False
        self.resync = False     # it may have missed messages (the broker was away): re-read
        self.wake = wake or asyncio.Event()     # one event per socket: no task per wait

    def put(self, item: Outgoing) -> bool:
        if self.dropped:
            return False
        if self.bytes + item.size > self.max_bytes or len(self.items) >= VIEWER_QUEUE_MESSAGES:
            self.dropped = True
            self.items.clear()
            self.bytes = 0
            self.wake.set()
            return False
        self.items.append(item)
        self.bytes += item.size
        self.wake.set()
        return True

    def pop(self, after: int = -1) -> Outgoing | None:
        """The next message; records messages with no step past `after` (the viewer has them
        from the store) are skipped, and consecutive records messages waiting come out as one
        (one send and one compression for a viewer that fell behind, not one per message)."""
        merged: list[Outgoing] = []
        while self.items:
            item = self.items[0]
            if merged and item.type != "records":
                break
            self.items.popleft()
            self.bytes -= item.size
            if item.type != "records":
                return item
            if item.last is not None and item.last > after:    # (none empty)
                merged.append(item)
        if len(merged) <= 1:
            return merged[0] if merged else None
        return Outgoing(records_text([m.records_body() for m in merged]), "records",
                        min(m.first for m in merged), max(m.last for m in merged))


class Fanout:
    """Per-run sets of viewers. Publishing never blocks: a viewer over budget is dropped."""

    def __init__(self, viewer_queue_bytes: int = VIEWER_QUEUE_BYTES,
                 broker: RedisBroker | None = None):
        self.viewer_queue_bytes = viewer_queue_bytes
        self.broker = broker
        self.viewers: dict[str, set[Viewer]] = {}
        self.trainers: dict[str, int] = {}   # open trainer sockets per run (after hello)
        # Trainer sockets of a run gone here while a watchdog of it waits (runs/lifecycle.py).
        self._departures: dict[str, int] = {}
        # Called with a run id when another process resumed or deleted it (its in-memory
        # state here is stale: app.py forgets the run's bandit).
        self.on_reset: Callable[[str], None] = lambda run_id: None
        self._tasks: set[asyncio.Task] = set()
        # Alive while someone holds or awaits it: no entry outlives its use.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    async def start(self) -> None:
        """Joins the other processes through the broker (none: nothing to do)."""
        if self.broker is not None:
            await self.broker.start(self._deliver_remote, self.resync,
                                    lambda: tuple(self.trainers))

    @contextlib.asynccontextmanager
    async def run_lock(self, run_id: str):
        """Held while deciding who may write a run: a hello claiming the trainer slot, a
        resume revoking the token, a checkpoint commit checking it, a branch linking files,
        a delete. Across processes with a broker."""
        lock = self._locks.get(run_id)
        if lock is None:
            lock = self._locks[run_id] = asyncio.Lock()
        async with lock:
            if self.broker is None:
                yield
            else:
                async with self.broker.lock(run_id):
                    yield

    def new_viewer(self, wake: asyncio.Event | None = None) -> Viewer:
        return Viewer(self.viewer_queue_bytes, wake)

    def subscribe(self, run_id: str, viewer: Viewer | None = None) -> Viewer:
        viewer = viewer or self.new_viewer()
        self.viewers.setdefault(run_id, set()).add(viewer)
        return viewer

    def unsubscribe(self, run_id: str, viewer: Viewer) -> None:
        viewers = self.viewers.get(run_id)
        if viewers is not None:
            viewers.discard(viewer)
            if not viewers:
                del self.viewers[run_id]

    def publish(self, run_id: str, message: dict) -> None:
        if not self.viewers.get(run_id) and self.broker is None:
            return
        item = Outgoing.of(message)         # encoded once, whatever the number of viewers
        self._deliver(run_id, item)
        if self.broker is not None:
            self.broker.publish(run_id, item.text)

    def _deliver(self, run_id: str, item: Outgoing) -> None:
        for viewer in list(self.viewers.get(run_id, ())):
            if not viewer.put(item):
                self.unsubscribe(run_id, viewer)   # its socket closes 1013

    def _deliver_remote(self, run_id: str, text: str) -> None:
        """A message another process published."""
        if text.startswith(('{"type":"resumed"', '{"type":"deleted"')):
            self.on_reset(run_id)
        if self.viewers.get(run_id):
            self._deliver(run_id, Outgoing.parse(text))

    def resync(self, run_id: str | None = None) -> None:
        """The run's viewers (None: every viewer) re-read the store from their cursors:
        messages may have been missed."""
        runs = [run_id] if run_id is not None else list(self.viewers)
        for viewer in (v for r in runs for v in self.viewers.get(r, ())):
            viewer.resync = True
            viewer.wake.set()

    # ---- trainers -------------------------------------------------------------------------
    async def claim_trainer(self, run_id: str) -> bool:
        """The run's trainer slot for a socket of this process (under run_lock); False when a
        trainer holds it already, here or on another process."""
        if self.has_local_trainer(run_id):
            return False
        if self.broker is not None and not await self.broker.claim_trainer(run_id):
            return False
        self.trainers[run_id] = self.trainers.get(run_id, 0) + 1
        if self.broker is not None:
            # It may come from a process that died with messages unpublished: the viewers
            # here re-read the store.
            self.resync(run_id)
        return True

    async def release_trainer(self, run_id: str) -> None:
        self._departures[run_id] = self._departures.get(run_id, 0) + 1
        self.trainers[run_id] -= 1
        if not self.trainers[run_id]:
            del self.trainers[run_id]
            if self.broker is not None:
                await self.broker.release_trainer(run_id)

    def trainer_departures(self, run_id: str, done: int | None = None) -> int:
        """How many of the run's trainer sockets went away here since its oldest waiting
        watchdog began. `done`: a watchdog that began at that count ends; with no departure
        since (no later watchdog), the count is dropped: no entry outlives its use."""
        n = self._departures.get(run_id, 0)
        if done is not None and n == done:
            self._departures.pop(run_id, None)
        return n

    def has_local_trainer(self, run_id: str) -> bool:
        return self.trainers.get(run_id, 0) > 0

    def has_trainer(self, run_id: str) -> bool:
        """For display and watchdogs: here, or on another process as of the last refresh."""
        return self.has_local_trainer(run_id) or (
            self.broker is not None and run_id in self.broker.remote_trainers)

    async def trainer_anywhere(self, run_id: str) -> bool:
        """For decisions (resume, delete; under run_lock): asks the broker now."""
        if self.has_local_trainer(run_id):
            return True
        return self.broker is not None and await self.broker.trainer_elsewhere(run_id)

    def connected_runs(self) -> tuple[str, ...]:
        remote = self.broker.remote_trainers if self.broker is not None else ()
        return tuple({*self.trainers, *remote})

    # ---- tasks ----------------------------------------------------------------------------
    def spawn(self, coro: Coroutine) -> None:
        """A background task owned here (the loop keeps only weak references to tasks), so
        shutdown can cancel it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.broker is not None:
            await self.broker.close()
