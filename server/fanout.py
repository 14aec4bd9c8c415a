"""Live runs: which viewer sockets watch a run, which runs have their trainer socket (THE
registry of "connected": telemetry, can_resume and resume all ask here), the per-run lock
that orders trainer hellos, resumes, branches and checkpoint commits, and the watchdog tasks
that mark a run interrupted when its trainer stays away (telemetry.py).

A published message is encoded to JSON once and the same text is queued for every viewer;
each viewer's queue is bounded in bytes: one that falls further behind is dropped at once (its
queue freed) and its socket closes 1013, so a slow or silent viewer never holds more than its
budget, however long it stays."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass

VIEWER_QUEUE_BYTES = 1 << 20     # live bytes buffered per viewer before it is dropped
VIEWER_QUEUE_MESSAGES = 1024     # and messages (each costs a little besides its text)


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
    def of(cls, message: dict) -> "Outgoing":
        kind = message.get("type", "")
        text = json.dumps(message, allow_nan=False, separators=(",", ":"))
        if kind == "records" and message.get("records"):
            steps = [r["step"] for r in message["records"]]
            return cls(text, kind, min(steps), max(steps))
        return cls(text, kind, step=message.get("step"))


class Viewer:
    """One watching socket's queue, bounded in bytes; `dropped` once it fell too far behind
    (the queue is emptied then: nothing waits for a viewer that will be closed)."""

    def __init__(self, max_bytes: int = VIEWER_QUEUE_BYTES):
        self.max_bytes = max_bytes
        self.items: deque[Outgoing] = deque()
        self.bytes = 0
        self.dropped = False
        self.wake = asyncio.Event()

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

    def pop(self) -> Outgoing | None:
        if not self.items:
            self.wake.clear()
            return None
        item = self.items.popleft()
        self.bytes -= item.size
        return item


class Fanout:
    """Per-run sets of viewers. Publishing never blocks: a viewer over budget is dropped."""

    def __init__(self, viewer_queue_bytes: int = VIEWER_QUEUE_BYTES):
        self.viewer_queue_bytes = viewer_queue_bytes
        self.viewers: dict[str, set[Viewer]] = {}
        self.trainers: dict[str, int] = {}   # open trainer sockets per run (after hello)
        self._tasks: set[asyncio.Task] = set()
        # Alive while someone holds or awaits it: no entry outlives its use.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    def run_lock(self, run_id: str) -> asyncio.Lock:
        """Held while deciding who may write a run: a hello claiming the trainer slot, a
        resume revoking the token, a checkpoint commit checking it, a branch linking files."""
        lock = self._locks.get(run_id)
        if lock is None:
            lock = self._locks[run_id] = asyncio.Lock()
        return lock

    def new_viewer(self) -> Viewer:
        return Viewer(self.viewer_queue_bytes)

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
        viewers = self.viewers.get(run_id)
        if not viewers:
            return
        item = Outgoing.of(message)         # encoded once, whatever the number of viewers
        for viewer in list(viewers):
            if not viewer.put(item):
                self.unsubscribe(run_id, viewer)   # its socket closes 1013

    def trainer_joined(self, run_id: str) -> None:
        self.trainers[run_id] = self.trainers.get(run_id, 0) + 1

    def trainer_left(self, run_id: str) -> None:
        self.trainers[run_id] -= 1
        if not self.trainers[run_id]:
            del self.trainers[run_id]

    def has_trainer(self, run_id: str) -> bool:
        return self.trainers.get(run_id, 0) > 0

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
