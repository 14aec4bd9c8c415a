"""A room run's operations (room/): join, leave, the owner's removal of a worker, a worker's
pseudo-gradient (from a file the caller received), its report and progress, and the room's
reads. Who may do each is partly the web layer's (the owner's token, web/deps.py authorize; a
worker's token is passed in and checked here, by the room); what follows is here: each change
under the run's lock, the round closed when it is due (room/lifecycle.py close_when_due), the
room's viewers told. The Room's blocking file work runs in a thread; a full disk is the
DISK_FULL it is."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from andrea.checkpoints import CheckpointStore, refusal_of
from andrea.config import Settings
from andrea.errors import INVALID, NOT_FOUND, Refused
from andrea.fanout import Fanout
from andrea.room.lifecycle import close_when_due, room_of_run
from andrea.room.lone import LONE_SCAN, lone_run
from andrea.room.rounds import Room, evals, worker_state
from andrea.services.runs import gone_meanwhile
from andrea.storage import StorageBudget
from andrea.store import Store

HIDDEN = {"token_sha256", "address", "reported"}   # a worker's fields nobody else reads


def room_of(run: dict, ckpts: CheckpointStore) -> Room:
    """The room of a stored run; NOT_FOUND for a run that is not a room run."""
    room = room_of_run(ckpts, run)
    if room is None:
        raise Refused(NOT_FOUND, f"run {run['id']} is not a room run")
    return room


async def _call(fn, *args):
    """A Room method in a thread; an OSError of a full disk as its refusal (RoomError and
    CheckpointError are refusals already)."""
    try:
        return await asyncio.to_thread(fn, *args)
    except OSError as e:
        raise refusal_of(e) or e


async def state(room: Room) -> dict:
    """The room now, as GET room answers it. `now`: the server's clock (a page counts a
    deadline down by it, not by its own). Each worker's `state` and `step`: what it does now
    (rounds.worker_state). The open round's `waiting_for`: the active workers it still waits
    for; it closes when they have answered, or at `deadline_at` once `quorum`
    pseudo-gradients are in (`quorum_met`)."""
    st = await _call(room.read)
    rounds = await _call(room.closed_rounds)
    progress = await _call(room.read_progress)
    cfg = room.room
    open_ = st["open"]
    answered = set(open_["received"]) | set(open_["refused"])
    return {
        "version": st["version"], "rounds": room.rounds, "finished": st["finished"],
        "now": time.time(),
        "config": cfg, "numel": room.numel, "delta_bytes": room.expected_bytes(),
        # what one worker would send per inner step with per-step fp32 gradient all-reduce
        # (its whole gradient once a step), beside what it sends per round here
        "allreduce_bytes_per_step": 4 * room.numel,
        "workers": [{"worker": int(w), **{k: v for k, v in info.items() if k not in HIDDEN},
                     **worker_state(st, w, progress, cfg.inner_steps)}
                    for w, info in st["workers"].items()],
        "open": {"received": sorted(map(int, open_["received"])),
                 "refused": {int(k): v for k, v in open_["refused"].items()},
                 "waiting_for": sorted(int(w) for w, info in st["workers"].items()
                                       if info["left"] is None and w not in answered),
                 "quorum_met": len(open_["received"]) >= cfg.quorum,
                 # cut (wait_for_slowest off): the workers still training send what they have
                 "cut": open_.get("cut_at") is not None,
                 "first_at": open_["first_at"], "opened_at": open_["opened_at"],
                 "deadline_at": open_["first_at"] and open_["first_at"] + cfg.round_deadline_s,
                 "stale": open_["stale"], "waiting": open_.get("waiting"),
                 # the most one element of a pseudo-gradient of this version may move
                 "delta_bound": room.bound(st)},
        "evals": evals(st),
        "closed": rounds,
    }


async def join(room: Room, fanout: Fanout, join_token: str, address: str,
               worker_token: str | None = None) -> dict:
    """A new worker (Room.join: its id, slot, token shown once, version to train), or the
    worker of `worker_token` again; with the room's rounds and config."""
    async with fanout.run_lock(room.run_id):
        joined = await _call(room.join, join_token, time.time(), address, worker_token)
    fanout.publish(room.run_id, {"type": "room", "event": "joined", "worker": joined["worker"]})
    return {**joined, "rounds": room.rounds, "room": room.room}


async def leave(room: Room, store: Store, fanout: Fanout, storage: StorageBudget,
                worker_token: str) -> None:
    """A worker leaves: out of the open round, which then closes at once where every worker
    left in it has answered (not at the next sweep: a closed tab holds nobody up)."""
    async with fanout.run_lock(room.run_id):
        now = time.time()
        await _call(room.leave, worker_token, now)
        await close_when_due(store, fanout, storage, room, now)
    fanout.publish(room.run_id, {"type": "room", "event": "left"})


async def remove(room: Room, store: Store, fanout: Fanout, storage: StorageBudget,
                 worker: int) -> None:
    """Worker `worker` removed (the caller authorized the run's owner): out of the round, and
    neither its token nor its address joins again."""
    async with fanout.run_lock(room.run_id):
        now = time.time()
        await _call(room.remove, worker, now)
        await close_when_due(store, fanout, storage, room, now)
    fanout.publish(room.run_id, {"type": "room", "event": "left", "worker": worker})


async def weights(room: Room, version: int):
    """(bytes, the verified file open at global version `version`'s weights), to stream."""
    return await _call(room.open_weights, version)


async def update(room: Room, version: int):
    """(bytes, the file open at version `version` as an int8 update of version - 1), to
    stream; NOT_FOUND where it is not kept as one."""
    return await _call(room.open_update, version)


async def check_sender(room: Room, worker_token: str) -> None:
    """NOT_ALLOWED unless the token is an active worker's: asked before a byte of a body is
    read or reserved (accept_delta asks again under the run's lock)."""
    st = await _call(room.read)
    await _call(room.worker_of, st, worker_token)


async def accept_delta(room: Room, store: Store, fanout: Fanout, storage: StorageBudget,
                       worker_token: str, version: int, path: Path,
                       steps: int | None = None) -> dict:
    """The worker's pseudo-gradient for `version`, received whole into `path` (a file of its
    own in room.dir, taken into the round or removed here), after `steps` inner steps (None:
    the round's). The round closes when this was its last answer. CONFLICT for a stale
    version or a second one; INVALID for one refused by value (the round goes on without it,
    and a good one may follow). Returns {"closed", "version"}."""
    try:
        async with fanout.run_lock(room.run_id):
            await gone_meanwhile(store, room.ckpts.data_dir, room.run_id, "pseudo-gradient")
            now = time.time()
            got = await _call(room.accept, worker_token, version, path, now, steps)
            # (a refused one may be the last answer the round waited for: it closes all the
            # same)
            closed = got["due"] and await close_when_due(store, fanout, storage, room, now)
    finally:
        path.unlink(missing_ok=True)      # (gone once taken into the round)
    if got.get("cut") and not closed:     # the workers still training send what they have
        fanout.publish(room.run_id, {"type": "room", "event": "cut", "version": version})
    if got["refused"] is not None:
        raise Refused(INVALID, f"pseudo-gradient refused: {got['refused']}; the round goes "
                               f"on without it{' (and it closed)' if closed else ''}; a good "
                               "one may still be sent")
    return {"closed": closed, "version": version}


async def report(room: Room, fanout: Fanout, worker_token: str, version: int,
                 losses: list[float], eval_loss: float | None, timings: dict | None,
                 max_bytes: int) -> None:
    """A worker's inner losses of the round that trained `version`, its eval loss of
    `version`, and its timings (Room.report: one per worker and version, within `max_bytes`,
    ANDREA_MAX_RUN_BYTES)."""
    async with fanout.run_lock(room.run_id):
        await _call(room.report, worker_token, version, losses, eval_loss, time.time(),
                    max_bytes, timings)
    fanout.publish(room.run_id, {"type": "room", "event": "report", "version": version})


async def progress(room: Room, fanout: Fanout, worker_token: str, version: int,
                   step: int) -> None:
    """A worker's inner step of `version` now: the room's page shows it. Not a report: nothing
    of it is kept once the round moves on."""
    async with fanout.run_lock(room.run_id):
        await _call(room.progress, worker_token, version, step, time.time())
    fanout.publish(room.run_id, {"type": "room", "event": "progress", "version": version})


async def reports(room: Room, offset: int, limit: int) -> dict:
    """The reports offset..offset + limit, oldest first; `next`: the next page's offset."""
    lines, total = await _call(room.reports, offset, limit)
    end = offset + len(lines)
    return {"reports": lines, "total": total, "next": end if end < total else None}


async def lone(run: dict, ckpts: CheckpointStore, store: Store, settings: Settings) -> dict:
    """The lone tab a room run is compared with (room/lone.py lone_run), from the newest
    LONE_SCAN runs' rows: bounded whatever the server holds."""
    room_of(run, ckpts)
    rows = await store.run(store.runs.page, LONE_SCAN)
    return lone_run(run, rows, time.time() - settings.start_grace_s)
