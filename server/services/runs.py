"""Runs: create one (a plain run, a room run, or a branch of another run's checkpoint), rename,
tag or annotate it, delete it, resume it from its newest checkpoint. Who may do each is the web
layer's (web/deps.py authorize, the rate of new runs per client); what follows is here: the
run's config as it is stored, the corpus and budgets it must fit, its row and its files, in an
order that a stop at any point leaves findable (runs/sweep.py mark_unsettled)."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from dataclasses import dataclass

from andrea.checkpoints import CheckpointError, CheckpointStore, newest_usable, refusal_of
from andrea.config import Settings
from andrea.data.batches import corpus_mismatch
from andrea.data.spec import BatchSpec
from andrea.data.windows import rows_problem
from andrea.errors import CONFLICT, DISK_FULL, INVALID, NOT_FOUND, Refused
from andrea.fanout import Fanout
from andrea.paths import run_dir, weights_path
from andrea.room.init import seeded_weights
from andrea.room.rounds import Room
from andrea.run_config import RunConfig, StoredRunConfig, model_name, run_layout, run_model
from andrea.runs.info import RESUMABLE, run_message
from andrea.runs.lifecycle import current_run, no_trainer, publish_run, watch_resumed
from andrea.runs.sweep import expire_later, mark_unsettled, settled
from andrea.storage import StorageBudget, estimated_run_bytes, mib
from andrea.store import Store
from andrea.write_tokens import new_token, token_hash


@dataclass
class Created:
    """A new run: its id, write token (shown once), stored config, layout and batch spec; a
    room run's join token (shown once), else None."""
    run_id: str
    token: str
    config: StoredRunConfig
    layout: dict
    spec: BatchSpec
    join_token: str | None


async def create(config: RunConfig, store: Store, data, runs, fanout: Fanout,
                 ckpts: CheckpointStore, settings: Settings, storage: StorageBudget) -> Created:
    """A new run of a validated config; with `parent`, a branch that starts after the parent's
    checkpoint (its owner authorized by the caller: the checkpoint becomes the branch's)."""
    count = await store.run(store.runs.count)
    if count >= settings.max_runs:
        raise Refused(DISK_FULL, f"this server holds {count} runs, its limit (ANDREA_MAX_RUNS): "
                                 "delete runs you no longer need (the runs page, or DELETE "
                                 "/api/runs/{id}), then create this one again")
    run_id = secrets.token_hex(6)
    token = new_token()
    # The run is tied to this server's corpus: a restart on other text answers 409, not
    # silently different batches; export finds the run's tokenizer by it.
    # (The corpus is read from disk the first time: off the event loop.)
    corpus_hash = "" if config.task else await asyncio.to_thread(data.corpus_hash)
    sources = config.sources
    if sources is not None:      # the picked sources: this corpus's, in its order
        corpus = await asyncio.to_thread(data.sources)
        sources = _picked_sources(sources, [s.name for s in corpus])
    cfg = StoredRunConfig.of(config, corpus_hash, sources=sources)
    spec = BatchSpec.of_run(cfg)
    _corpus_serves(spec, data)
    layout = run_layout(cfg)
    await _storage_quota(cfg, layout, data, settings, storage)
    join_token = None
    if config.room is not None:
        # A room run is open to its workers from now on: `running` until its last round closes
        # (the sweep never expires it), its join token shown once, as the write token is.
        join_token = new_token()
        room = Room(ckpts.data_dir, ckpts, run_id, cfg, layout)
        held = await _room_quota(room, settings, storage)
        try:
            await store.run(store.runs.create, run_id, cfg, token_hash(token), None)
            # Version 0 is the run's seeded init, made here: no worker uploads it.
            await asyncio.to_thread(lambda: room.create(
                join_token, seeded_weights(layout, cfg.seed), time.time()))
        finally:
            held.release()
        await store.run(store.runs.set_status, run_id, "running",
                        "a room run: open to its workers")
    elif config.parent is None:
        await store.run(store.runs.create, run_id, cfg, token_hash(token), None)
        # Its viewers (and the list) read "never started" once the grace period has passed
        # without a trainer; the app's sweep expires it too (after a restart: expire_runs).
        fanout.spawn(expire_later(store, fanout, settings.start_grace_s))
    else:
        await _branch(run_id, cfg, token_hash(token), store, fanout, ckpts)
    runs.register(run_id, spec)
    return Created(run_id, token, cfg, layout, spec, join_token)


async def update(store: Store, fanout: Fanout, run_id: str, fields: dict) -> dict:
    """A run renamed, its tags or notes set (`fields`: those given); the run as its viewers
    are told it."""
    if "name" in fields:
        fields["name"] = fields["name"].strip()
        if not fields["name"]:
            raise Refused(INVALID, "a run's name cannot be empty")
    if "tags" in fields:
        tags = [t.strip() for t in fields["tags"] if t.strip()]
        fields["tags"] = list(dict.fromkeys(tags))        # unique, in order
    if not await store.run(store.runs.update, run_id, fields):
        raise Refused(NOT_FOUND, f"unknown run {run_id!r}")
    return await publish_run(store, fanout, run_id)


async def delete(store: Store, fanout: Fanout, runs, data_dir, run_id: str) -> None:
    """The run, its metrics, events, checkpoints and weights; refused (RunBusy) while a trainer
    is connected (the tab training it would go on writing)."""
    busy = "a tab is training this run: stop it there first, or wait until its trainer is gone"
    async with no_trainer(fanout, run_id, busy):    # no hello, resume or checkpoint commit
        # Marked first: a stop between the row's delete and the files' leaves them findable.
        await asyncio.to_thread(mark_unsettled, data_dir, run_id)
        if not await store.run(store.runs.delete, run_id):
            await asyncio.to_thread(settled, data_dir, run_id)
            raise Refused(NOT_FOUND, f"unknown run {run_id!r}")
        await asyncio.to_thread(shutil.rmtree, run_dir(data_dir, run_id), True)
    runs.forget(run_id)
    fanout.publish(run_id, {"type": "deleted", "run_id": run_id})


async def _room_quota(room: Room, settings: Settings, storage: StorageBudget):
    """A room this server can hold, or INVALID with the number (ANDREA_ROOM_MAX_PARAMS); then
    its most bytes on disk at once (max_workers pseudo-gradients of a round and three versions:
    the two kept and a close's new one) must fit the storage budget now (DISK_FULL), and
    version 0's are reserved (the Reservation, to release once written)."""
    if room.numel > settings.room_max_params:
        raise Refused(INVALID, f"a room run of {room.numel:,} parameters is more than this "
                               f"server holds ({settings.room_max_params:,}, "
                               "ANDREA_ROOM_MAX_PARAMS): choose a smaller model")
    most = room.room.max_workers * room.expected_bytes() + 3 * room.close_bytes()
    (await storage.reserve(most, "a room run's rounds")).release()
    return await storage.reserve(room.close_bytes(), "a room run's version 0")


async def _storage_quota(cfg: StoredRunConfig, layout: dict, data, settings: Settings,
                         storage: StorageBudget) -> None:
    """The records a new run's config will store (storage.estimated_run_bytes: its steps, each
    with per-row losses, per-tensor grad norms and source losses): INVALID past max_run_bytes
    (the config asks for more than a run may have here: fewer steps or a smaller batch),
    DISK_FULL when they do not fit above the data dir's floor (the server's state: free space,
    try again)."""
    sources = len(cfg.sources) if cfg.sources else len(await asyncio.to_thread(data.sources))
    steps, batch, tensors = cfg.steps, cfg.batch_size, len(layout["params"])
    per_step = estimated_run_bytes(1, batch, tensors, sources)
    estimate = estimated_run_bytes(steps, batch, tensors, sources)
    how = (f"{steps:,} steps x ~{per_step / 1000:,.1f} KB a record: per-row losses of batch "
           f"{batch}, grad norms of {tensors} tensors")
    if estimate > settings.max_run_bytes:
        fits = settings.max_run_bytes // per_step
        raise Refused(INVALID, f"this run's records would take about {mib(estimate)} in the "
                               f"store ({how}), more than the {mib(settings.max_run_bytes)} "
                               "a run may store on this server (ANDREA_MAX_RUN_BYTES): ask "
                               f"for at most {fits:,} steps, or a smaller batch_size. "
                               "Nothing was stored")
    await storage.check_run(estimate, how)


def _corpus_serves(spec: BatchSpec, data) -> None:
    """INVALID for a run whose rows this corpus cannot hold (windows.rows_problem: its
    seq_len + 1 tokens in a training part and in a held-out tail, in each picked source when it
    picks some), with the sizes, before anything is stored: it used to be accepted and fail at
    batch 0. Read from the token files of the run's vocab size when they are made (the start's
    warm-up makes the presets'); a vocab size nobody asked for yet is not built here (that
    took tens of seconds on a loaded machine, past clients' timeouts): its first batch says
    the same."""
    corpus = None if spec.task else data.ready(spec.vocab_size)
    if corpus is None:
        return
    if why := rows_problem(corpus.files, spec):
        raise Refused(INVALID, f"the corpus cannot serve this run: {why}. Nothing was stored")


def _picked_sources(picked: list[str], names: list[str]) -> list[str]:
    """A run's `sources`, checked against this server's corpus (INVALID names each unknown one
    and lists the known), in corpus order (the batch header's source indices)."""
    unknown = [s for s in picked if s not in names]
    if unknown:
        raise Refused(INVALID, f"sources: unknown source{'s' * (len(unknown) > 1)} "
                               f"{', '.join(map(repr, unknown))}; this server's sources are "
                               f"{', '.join(names)} (GET /api/corpus)")
    return [n for n in names if n in picked]


async def _branch(run_id: str, cfg: StoredRunConfig, token_sha256: str, store: Store,
                  fanout: Fanout, ckpts: CheckpointStore) -> None:
    """The parent's checkpoint K becomes the new run's checkpoint K (hard-linked), its metrics
    and events up to K are copied, and the run starts at step K + 1, as a resume does."""
    parent_id, step = cfg.parent.run, cfg.parent.step
    parent = await store.run(store.runs.get, parent_id)
    if parent is None:
        raise Refused(NOT_FOUND, f"unknown parent run {parent_id!r}")
    pc = parent["config"]
    if pc.room is not None:
        raise Refused(CONFLICT, f"run {parent_id} is a room run: its checkpoints hold the "
                                "room's global weights, not one trainer's state to go on from")
    if (run_model(pc), pc.optimizer) != (run_model(cfg), cfg.optimizer):
        raise Refused(CONFLICT, f"a branch keeps its parent's model and optimizer (the "
                                f"checkpoint's sections): run {parent_id} is {model_name(pc)} "
                                f"with {pc.optimizer}, this config {model_name(cfg)} with "
                                f"{cfg.optimizer}")
    if step >= cfg.steps:
        raise Refused(CONFLICT, f"the branch starts after step {step}: its steps "
                                f"({cfg.steps}) must be more than that")
    committed = await store.run(store.metrics.last_step, parent_id) or 0
    if step > committed:   # the branch copies the parent's records up to its step
        raise Refused(CONFLICT, f"run {parent_id}'s records are committed up to step "
                                f"{committed}: branch from a checkpoint at or before it")
    # The files come before the row: marked, so that a stop in between leaves none behind.
    await asyncio.to_thread(mark_unsettled, ckpts.data_dir, run_id)
    await _link_parent(ckpts, fanout, parent_id, step, run_id)   # NOT_FOUND without it
    name = f"{parent['name']} · branch at {step}"[:120]
    try:   # the copy goes in pages: trainers' commits go on between them
        why_not = await store.runs.branch(run_id, cfg, token_sha256, parent_id, step, name)
        if why_not:
            raise Refused(CONFLICT, f"{why_not}; nothing of the branch was kept")
    except BaseException:
        await asyncio.to_thread(ckpts.remove_run, run_id)
        raise
    await asyncio.to_thread(settled, ckpts.data_dir, run_id)


async def _link_parent(ckpts: CheckpointStore, fanout: Fanout, parent_id: str, step: int,
                       run_id: str) -> None:
    """A branch's files: the parent's checkpoint `step` becomes the new run's (hard links),
    under the parent's lock so a prune cannot take it meanwhile."""
    async with fanout.run_lock(parent_id):
        try:
            await asyncio.to_thread(ckpts.link, parent_id, step, run_id)
        except (CheckpointError, OSError) as e:
            await asyncio.to_thread(ckpts.remove_run, run_id)
            raise refusal_of(e) or e


async def gone_meanwhile(store: Store, data_dir, run_id: str, what: str) -> None:
    """NOT_FOUND, the run's folder removed again (an upload that began after the delete made
    it anew), when the run was deleted while `what` was uploaded. Under the run's lock: a
    delete takes it too, so a run that is there now stays there until the upload is committed."""
    if await store.run(store.runs.get, run_id) is not None:
        return
    await asyncio.to_thread(shutil.rmtree, run_dir(data_dir, run_id), True)
    raise Refused(NOT_FOUND, f"run {run_id} was deleted during the upload of its {what}; "
                             "nothing was stored")


WHY_NOT_RESUMABLE = {
    "finished": "the run is finished: there is nothing left to train",
    "created": "the run has not started since it was made or resumed: open its page to train it",
}


async def resume(run_id: str, store: Store, fanout: Fanout, ckpts: CheckpointStore, runs, data,
                 trainer_grace_s: float) -> tuple[str, int, dict]:
    """Takes a run over from its newest usable checkpoint: -> (a new write token, the
    checkpoint's step, the run now). The old token is refused from now on, the metrics and
    events after the checkpoint are deleted, and the run is `created` again."""
    token = new_token()
    busy = ("a trainer is connected to this run (another tab is training it): stop it there, "
            "or wait until it is gone")
    gone = f"run {run_id} was deleted"
    async with no_trainer(fanout, run_id, busy):    # no hello, commit or other resume between
        run = await store.run(store.runs.get, run_id)
        if run is None:     # a delete came first (it holds the same lock)
            raise Refused(NOT_FOUND, gone)
        if run["config"].room is not None:
            raise Refused(CONFLICT, "a room run is not resumed: its workers join it again "
                                    "and take its newest global version")
        if run["status"] not in RESUMABLE:
            raise Refused(CONFLICT, WHY_NOT_RESUMABLE.get(run["status"], run["status"]))
        # Refused before anything changes (its token, its records): on other text its first
        # batch would fail it.
        if why := corpus_mismatch(run["config"].corpus_hash,
                                  await asyncio.to_thread(data.corpus_hash)):
            raise Refused(CONFLICT, f"cannot resume here: {why}")
        step = await usable_checkpoint(store, ckpts, run_id)
        why = await store.run(store.runs.resume, run_id, step, token_hash(token), RESUMABLE)
        if why:
            raise Refused(NOT_FOUND if why.startswith("unknown run") else CONFLICT,
                          f"cannot resume: {why}")
        # Checkpoints after `step` (uploaded by a tab that died before their records) belong
        # to the abandoned timeline: the records they follow are gone, and the old token too.
        # So do its final weights (an export would serve them with the card of `step`).
        await asyncio.to_thread(ckpts.discard_after, run_id, step)
        await asyncio.to_thread(weights_path(ckpts.data_dir, run_id).unlink, True)
    runs.forget(run_id)       # its bandit replays the records that are left
    info = await current_run(store, fanout, run_id)
    if info is None:        # deleted right after the resume
        raise Refused(NOT_FOUND, gone)
    watch_resumed(store, fanout, trainer_grace_s, run_id)
    fanout.publish(run_id, {"type": "resumed", "step": step})
    fanout.publish(run_id, run_message(info))
    return token, step, info


async def usable_checkpoint(store: Store, ckpts: CheckpointStore, run_id: str) -> int:
    """The newest checkpoint whose steps all have committed records (checkpoints.newest_usable)."""
    last = await store.run(store.metrics.last_step, run_id) or 0
    metas = await asyncio.to_thread(ckpts.list, run_id)
    step = newest_usable(metas, last)
    if step is None:
        have = ", ".join(str(m["step"]) for m in metas) or "none"
        raise Refused(NOT_FOUND, f"run {run_id} has no checkpoint to resume from whose "
                                 f"records are committed (records up to step {last}; "
                                 f"checkpoints: {have})")
    return step
