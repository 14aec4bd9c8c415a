"""What a room's rounds do to its run: the room of a stored run, its viewers told when a round
closes, the run finished after its last one, and the closes of rounds whose deadline passed
(close_due_rounds: the app's sweep runs it, app.py and runs/sweep.py expire_runs). Nothing here
is HTTP's."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path

from andrea.checkpoints import DISK_ERRNOS, CheckpointError, CheckpointStore
from andrea.room.rounds import Room, RoomError
from andrea.run_config import run_layout
from andrea.runs.lifecycle import publish_run
from andrea.storage import DiskFull

log = logging.getLogger("andrea.room")


def room_of_run(ckpts: CheckpointStore, run: dict) -> Room | None:
    """The room of a stored run; None for a run that is not a room run."""
    if run["config"].room is None:
        return None
    return Room(ckpts.data_dir, ckpts, run["id"], run["config"], run_layout(run["config"]))


async def after_close(store, fanout, room: Room) -> None:
    """A round closed (under the run's lock): its viewers told, and the run finished after its
    last round."""
    st = await asyncio.to_thread(room.read)
    fanout.publish(room.run_id, {"type": "room", "event": "version", "version": st["version"],
                                 "round": _finite(st.get("last_round"))})
    if st["finished"]:
        await store.run(store.runs.set_status, room.run_id, "finished")
        await publish_run(store, fanout, room.run_id)


def _finite(value):
    """JSON-safe (messages allow no NaN): a non-finite number (a poisoned round's norm) as
    None, so the close is still told."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


async def recover_rooms(store, fanout, ckpts: CheckpointStore) -> None:
    """At start: every room's close that a stop cut short finished, and its run finished if
    that was the last round (the stop came before the run was told); the pseudo-gradients of
    closed rounds left on disk removed."""
    async def recover(run: dict, room: Room) -> None:
        st = await asyncio.to_thread(room.recover)
        if st["finished"] and run["status"] != "finished":
            await after_close(store, fanout, room)
    runs = await asyncio.to_thread(lambda: [state.parent.parent.name for state in
                                            (ckpts.data_dir / "runs").glob("*/room/state.json")])
    await _each_room(store, fanout, ckpts, runs, recover, "recovered")


async def close_when_due(store, fanout, storage, room: Room, now: float) -> bool:
    """Under the run's lock: the open round closed if it is due, its bytes reserved in the
    storage budget first. A close that cannot reserve them (or that the disk refuses) closes
    nothing: the room says it waits for disk and tries again later, with a longer wait each
    time, and the workers' pseudo-gradients stay in the round. Returns whether it closed."""
    st = await asyncio.to_thread(room.load)
    if not room.due(st, now) or now < (st["open"].get("retry_at") or 0):
        return False
    try:
        held = await storage.reserve(room.close_bytes(), f"round {st['version']}'s close")
    except DiskFull:
        await _wait_for_disk(fanout, room, room.close_bytes(), now)
        return False
    try:
        line = await asyncio.to_thread(room.close_if_due, now, True)
    except OSError as e:
        if e.errno not in DISK_ERRNOS:
            raise
        await _wait_for_disk(fanout, room, room.close_bytes(), now)
        return False
    finally:
        held.release()
    if line is None:
        return False
    await after_close(store, fanout, room)
    return True


async def _wait_for_disk(fanout, room: Room, nbytes: int, now: float) -> None:
    why = f"waiting for {nbytes / (1 << 20):.0f} MiB of disk to close the round"
    at = await asyncio.to_thread(room.wait_for_disk, why, now)
    log.warning("run %s: %s (again at %s)", room.run_id, why, time.ctime(at))
    fanout.publish(room.run_id, {"type": "room", "event": "waiting", "waiting": why})


async def close_due_rounds(store, fanout, ckpts: CheckpointStore, storage) -> list[str]:
    """Every room's workers that hold a slot for free dropped (Room.drop_silent), and every
    open round past its deadline with a quorum closed (the app's sweep). Returns the runs
    whose round closed."""
    closed = []
    now = time.time()

    async def close(run: dict, room: Room) -> None:
        if await asyncio.to_thread(room.drop_silent, now):
            fanout.publish(room.run_id, {"type": "room", "event": "left"})
        if await close_when_due(store, fanout, storage, room, now):
            closed.append(run["id"])
    await _each_room(store, fanout, ckpts, await asyncio.to_thread(_rooms_waiting,
                                                                   ckpts.data_dir),
                     close, "closed")
    return closed


async def _each_room(store, fanout, ckpts: CheckpointStore, run_ids: list[str], act,
                     what: str) -> None:
    """act(run, room) under each room run's lock; one room whose files are damaged holds up no
    other room's (logged)."""
    for run_id in run_ids:
        try:
            run = await store.run(store.runs.get, run_id)
            room = run and room_of_run(ckpts, run)
            if room is None:
                continue
            async with fanout.run_lock(run_id):
                await act(run, room)
        except (RoomError, CheckpointError, OSError, ValueError, KeyError):
            log.warning("run %s: its room could not be %s", run_id, what, exc_info=True)


def _rooms_waiting(data_dir: Path) -> list[str]:
    """The runs whose room is open and has a worker (read without the lock: the room is looked
    at again under it)."""
    out = []
    for state in (data_dir / "runs").glob("*/room/state.json"):
        try:
            st = json.loads(state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not st.get("finished") and any(w["left"] is None for w in st["workers"].values()):
            out.append(state.parent.parent.name)
    return out
