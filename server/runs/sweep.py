"""The app's sweep of runs, apart from any request: runs that no trainer ever started become
`abandoned` (once each new run's grace period has passed, expire_later, and every
EXPIRE_EVERY_S, expire_runs), room runs' rounds close at their deadline, branches a dead
process left half-copied are removed (drop_unfinished_branches: at start, and by the sweep of
processes that share a store), and so are the files a stop left without their run's row
(settle_run_folders, at start)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from andrea.durable import fsync_dir
from andrea.paths import run_dir, runs_dir, unsettled_mark
from andrea.runs.info import abandoned_message
from andrea.runs.lifecycle import publish_run

log = logging.getLogger("andrea.runs")


async def expire(store, fanout, grace_s: float) -> None:
    """Runs `created` more than `grace_s` ago that no trainer ever started become `abandoned`
    (shown as "never started"), and their viewers are told. Once the grace period of each new
    run has passed (expire_later), and by the app's sweep (expire_runs). Never on a read:
    reads show such a run as it is about to be stored (info.read_run)."""
    for run_id in await store.run(store.runs.abandon_stale, time.time() - grace_s,
                                  fanout.connected_runs(), abandoned_message(grace_s)):
        await publish_run(store, fanout, run_id)


async def expire_later(store, fanout, grace_s: float) -> None:
    await asyncio.sleep(grace_s + 0.5)
    try:
        await expire(store, fanout, grace_s)
    except Exception:       # (a store out of reach now: the app's sweep expires it later)
        log.warning("expiring runs that never started failed", exc_info=True)


EXPIRE_EVERY_S = 5.0        # how often the app's sweep expires runs that never started
# A branch whose copy has not moved for this long was left by a process that died mid-copy (a
# live copy commits a page every fraction of a second, each page touching the branch's row).
BRANCH_STALE_S = 300.0


def mark_unsettled(data_dir: Path, run_id: str) -> None:
    """Before a run's folder gets ahead of its row (files linked for a branch whose row is not
    written yet; a row deleted before its files): a crash in between leaves a folder the next
    start can tell from another database's (settle_run_folders). Durable before the change."""
    mark = unsettled_mark(data_dir, run_id)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    fsync_dir(mark.parent)


def settled(data_dir: Path, run_id: str) -> None:
    """The row and the folder agree again (a branch's row written)."""
    unsettled_mark(data_dir, run_id).unlink(missing_ok=True)


async def settle_run_folders(store, data_dir: Path, before: float | None) -> list[str]:
    """At start: the run folders a crash left marked unsettled (mark_unsettled) before `before`
    (None: all, this process being the only one): removed when their run has no row (a delete
    that committed, a branch that never did), else unmarked. Returns the removed runs' ids."""
    removed = []
    runs = runs_dir(data_dir)
    marks = await asyncio.to_thread(lambda: list(runs.glob("*/UNSETTLED")) if runs.is_dir()
                                    else [])
    for mark in marks:
        run_id = mark.parent.name
        try:
            if before is not None and mark.stat().st_mtime >= before:
                continue            # maybe another process's, in progress
        except FileNotFoundError:
            continue
        if await store.run(store.runs.get, run_id) is None:
            await asyncio.to_thread(shutil.rmtree, mark.parent, True)
            removed.append(run_id)
            log.warning("run %s: files of a run with no row (a delete or a branch cut short by "
                        "a stop) were removed", run_id)
        else:
            settled(data_dir, run_id)
    return removed


async def drop_unfinished_branches(store, data_dir: Path, before: float | None) -> list[str]:
    """Branches a process left half-copied when it died (store.runs.unfinished_branches: their copy
    last moved before `before`; None: all): their rows, records and files removed. At start
    (app.py: all of them when this process is the only one), and by the sweep of processes that
    share their store (expire_runs). Returns their ids."""
    dropped = await store.run(store.runs.unfinished_branches, before)
    for run_id in dropped:
        while await store.run(store.runs.drop_branch_page, run_id):
            pass
        await asyncio.to_thread(shutil.rmtree, run_dir(data_dir, run_id), True)
        log.warning("run %s: a branch left half-copied (its server stopped mid-copy) was "
                    "removed", run_id)
    return dropped


async def expire_runs(store, fanout, grace_s: float, data_dir: Path | None = None,
                      also: Callable[[], Awaitable[object]] | None = None) -> None:
    """The app's sweep, started with its lifespan (app.py): now, for the runs left from before
    a restart, then every EXPIRE_EVERY_S in the background, for what a run's own timer
    (expire_later) missed (the store out of reach then, the process that made it gone). With
    `data_dir` (processes sharing the store), also the branches whose copy stopped moving
    BRANCH_STALE_S ago (drop_unfinished_branches: their process died). `also`: more of the
    app's sweep, each time (the app's: the room runs' rounds whose deadline passed, whose
    package builds on this one's)."""
    async def sweep(failing: bool) -> bool:
        try:
            await expire(store, fanout, grace_s)
            if also is not None:
                await also()
            if data_dir is not None:
                await drop_unfinished_branches(store, data_dir, time.time() - BRANCH_STALE_S)
            return False
        except Exception:
            if not failing:     # once, not every few seconds while the store is away
                log.warning("expiring runs that never started failed", exc_info=True)
            return True

    async def every() -> None:
        failing = False
        while True:
            await asyncio.sleep(EXPIRE_EVERY_S)
            failing = await sweep(failing)

    await sweep(False)
    fanout.spawn(every())
