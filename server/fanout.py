"""Live runs: which viewer sockets watch a run, which runs have their trainer socket (THE
registry of "connected": telemetry, can_resume and resume all ask here), the per-run lock
that orders trainer hellos, resumes, branches and checkpoint commits, and the watchdog tasks
that mark a run interrupted when its trainer stays away (telemetry.py)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine

VIEWER_QUEUE = 256               # messages buffered per viewer before it is dropped


class Viewer:
    """One watching socket's bounded queue; `dropped` once it fell too far behind."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=VIEWER_QUEUE)
        self.dropped = False


class Fanout:
    """Per-run sets of viewers. Publishing never blocks: a full queue drops its viewer."""

    def __init__(self):
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
