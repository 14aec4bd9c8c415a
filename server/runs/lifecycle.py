"""A run's life around its trainer: telling its viewers what the run is now (publish_run), the
watchdogs that mark it interrupted when its training tab goes away for good, or when the tab
that resumed it never comes, and the lock under which a run is changed only while no trainer
holds it (resume, delete). The trainer socket (telemetry/trainer.py) and the runs' service
(services/runs.py) share these; none of it is HTTP's or a socket's: a busy run raises RunBusy,
a Refused the app answers 409 (web/errors.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from andrea.broker import BrokerUnavailable
from andrea.errors import CONFLICT, Refused
from andrea.fanout import Fanout
from andrea.runs.info import public_run, run_message
from andrea.store import Store

ABANDONED = "the training tab went away before the run ended"


class RunBusy(Refused):
    """A change that needs the run free of trainers, while one is connected (CONFLICT: 409)."""

    def __init__(self, message: str):
        super().__init__(CONFLICT, message)


async def current_run(store: Store, fanout: Fanout, run_id: str) -> dict | None:
    """The run as the API and its viewers see it now (info.public_run); None once it is
    gone."""
    run = await store.run(store.runs.get, run_id)
    return None if run is None else public_run(run, fanout.has_trainer(run_id))


async def publish_run(store: Store, fanout: Fanout, run_id: str, **extra) -> dict | None:
    """Tells the run's viewers what it is now ({"type": "run"}, with `extra` fields), and
    returns that; None, and nothing told, once the run is gone."""
    info = await current_run(store, fanout, run_id)
    if info is None:
        return None
    info = {**info, **extra}
    fanout.publish(run_id, run_message(info))
    return info


@asynccontextmanager
async def no_trainer(fanout: Fanout, run_id: str, busy: str) -> AsyncIterator[None]:
    """The run's lock (no hello, resume, delete or checkpoint commit in between, on any
    process), held only while no trainer is connected to the run anywhere: RunBusy(`busy`)
    when one is."""
    async with fanout.run_lock(run_id):
        if await fanout.trainer_anywhere(run_id):
            raise RunBusy(busy)
        yield


def watch_trainer_gone(store: Store, fanout: Fanout, grace_s: float, run_id: str) -> None:
    """After a run's trainer socket went away: a run whose training tab stays away past the
    grace period (closed, reloaded, crashed; or, resumed or branched, closed while loading its
    checkpoint) is marked interrupted, so that the list does not show it running (or `created`)
    for good and it can be resumed. Counted from the latest departure: a tab that drops, comes
    back and drops again is judged by the second drop's watchdog. A trainer that comes back
    reports its status again and flips it back."""
    fanout.spawn(_mark_if_abandoned(store, fanout, grace_s, run_id,
                                    fanout.trainer_departures(run_id)))


def watch_resumed(store: Store, fanout: Fanout, grace_s: float, run_id: str) -> None:
    """A resumed run is `created` until its new tab reports; if that tab never comes, the run
    is marked interrupted again, so it can be resumed once more instead of staying `created`
    for good."""
    fanout.spawn(_mark_if_abandoned(store, fanout, grace_s, run_id))


async def watch_runs_left(store: Store, fanout: Fanout, grace_s: float) -> None:
    """At start: the watchdogs of the runs a training tab should be at (running, paused, or
    created from a checkpoint), which a restart took down with the old process. A tab still
    alive reconnects within the grace period; the others' runs become interrupted."""
    for run_id in await store.run(store.runs.awaiting_trainer):
        watch_resumed(store, fanout, grace_s, run_id)


RESUME_NEVER_CAME = "the tab that resumed this run went away before it trained"


async def _mark_if_abandoned(store: Store, fanout: Fanout, grace_s: float, run_id: str,
                             departures: int | None = None) -> None:
    """The run, if no trainer is at it anywhere after `grace_s`, becomes `interrupted`: when
    running or paused (ABANDONED), or created from a checkpoint (RESUME_NEVER_CAME; a run
    created without one is the sweep's: `abandoned`). `departures`: its trainers' departures
    here when this watchdog began; a later one leaves the decision to its own watchdog."""
    await asyncio.sleep(grace_s)
    if departures is not None and fanout.trainer_departures(run_id, done=departures) \
            != departures:
        return
    try:
        if await fanout.trainer_anywhere(run_id):
            return
    except BrokerUnavailable:
        return      # cannot tell: leave it; the next trainer or watchdog decides
    run = await store.run(store.runs.get, run_id)
    if run is None or run["config"].room is not None:     # a room's workers are no trainer
        return
    status = run["status"]
    if status in ("running", "paused"):
        message = ABANDONED
    elif status == "created" and run["checkpoint_step"] is not None:
        message = RESUME_NEVER_CAME
    else:
        return
    # One transaction reads and sets: a resume between a read and a write would be undone.
    if await store.run(partial(store.runs.set_status, run_id, "interrupted", message,
                               only=(status,))) == "interrupted":
        await publish_run(store, fanout, run_id)
