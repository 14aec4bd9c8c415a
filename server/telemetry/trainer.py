"""The trainer socket, `/ws/runs/{id}`: the training tab's, one per run (protocol.py has its
messages). It commits each metrics batch to the store, acks it, and publishes exactly what was
committed to the run's viewers (fanout.py); status changes and samples likewise. Each message
is paced by its bytes (quotas.MessageRates: per run and per client address; pings, the
websocket layer's ping frames among them, and whatever comes before the hello too: PING_COST,
HELLO_COST) and, before it is committed, checked against the storage budget (storage.py: the
data dir's floor, the run's max_run_bytes; past either the socket is closed
protocol.STORAGE_BUDGET). When it goes, runs/lifecycle.py marks the run interrupted if no
trainer comes back within the grace period."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from andrea.broker import BrokerUnavailable
from andrea.data.hub import DataHub
from andrea.data.run_registry import RunRegistry, source_index, sources_text
from andrea.errors import CONFLICT, DISK_FULL, INVALID, NOT_ALLOWED, NOT_FOUND, TOO_OFTEN
from andrea.metrics import Record
from andrea.run_config import StoredRunConfig
from andrea.runs.info import public_run, run_message
from andrea.runs.lifecycle import publish_run, watch_trainer_gone
from andrea.storage import FLOOR, RUN_BYTES, RunBytes, StorageFull, message_bytes, stored_run_bytes
from andrea.store import StoreUnavailable
from andrea.telemetry.protocol import (
    BUSY,
    MAX_MESSAGE_BYTES,
    PING_FLOOD,
    RECORDS_PER_MESSAGE,
    REVOKED_TOKEN,
    TRAINER_FRAME_BYTES,
    Hello,
    Metrics,
    Ping,
    ProtocolError,
    Sample,
    Status,
    TrainerMessage,
    accept,
    close_frame,
    parse,
    receive_sized,
    receive_text,
    refuse,
)
from andrea.telemetry.record_checks import (
    check_inside,
    check_precision,
    check_rows,
    check_tensors,
    layer_count,
    tensor_count,
)
from andrea.telemetry.uvicorn_shim import limit_pings
from andrea.web.deps import (
    REVOKED,
    DataDep,
    FanoutDep,
    MessageRatesDep,
    RunsDep,
    SettingsDep,
    StorageDep,
    StoreDep,
)
from andrea.web.quotas import MessageRates, SampleQuota, TokenBucket, sample_bytes

log = logging.getLogger("andrea.telemetry")
router = APIRouter()

HELLO_TIMEOUT_S = 30
# A trainer may send this many seconds' worth of Settings.metrics_rate_per_s at once.
METRICS_BURST_S = 2
# Statuses a trainer's message cannot change (only a resume or a branch trains such a run).
FINAL = ("finished", "failed")
# What a message costs against the bytes per second (quotas.MessageRates): its UTF-8 bytes, at
# least MIN_COST; a status change at least STATUS_COST (a transaction, a read of the run and a
# message to each viewer: 64 a second per run at the default 1 MiB/s).
MIN_COST, STATUS_COST = 256, 16 << 10
# A ping (message or websocket ping frame) costs PING_COST, and what a socket sends before its
# hello (the hello too: a token check and a run read) at least HELLO_COST, from its address'
# bucket alone (anyone may name any run). At the default 1 MiB/s: 128 at once, then 64 a
# second, per address (and per run, after the hello); a page pings once per sync, the
# websockets library every 20 s. (Before, a ping message cost 256 B, 4096 a second unpaced, and
# a ping frame or anything before the hello nothing: a ping flood raised another trainer's ack
# median from 2.6 to 8.4 ms.)
PING_COST = HELLO_COST = 16 << 10
# A socket's own ping frames, which cannot be paced as exactly as messages (the websocket layer
# reads and answers them while the app waits): a burst, then a rate; one past them closes the
# socket 1008 (kind ping_flood), far above any client's need.
PING_FRAMES = (20, 2.0)
# What the page is told to do when the storage budget closes its socket (protocol.py).
STORAGE_NEXT = {
    FLOOR: "ask the operator to free space or delete runs no longer needed",
    RUN_BYTES: "this run can store no more records on this server: ask the operator to raise "
                "ANDREA_MAX_RUN_BYTES, or branch a shorter run from a checkpoint",
}


def _feed_bandit(runs: RunRegistry, run_id: str, records: list[Record]) -> None:
    # Every record counts, also one without usable losses: the bandit's next phase waits for
    # every step of the phases it depends on (data/bandit.py).
    for r in records:
        runs.report_losses(run_id, r.step, r.source_losses or {})


class _PingFrames:
    """What the socket's websocket ping frames cost (uvicorn_shim.limit_pings asks before each
    pong): PING_COST from the address' bucket (and the run's, once the hello made the socket
    the run's: `run`), waited out by not reading the socket; past PING_FRAMES, the close."""

    def __init__(self, rates: MessageRates, client: str, run_id: str):
        self.rates, self.client, self.run_id = rates, client, run_id
        self.run: str | None = None     # the run's, after its hello
        self.frames = TokenBucket(*PING_FRAMES)

    def __call__(self):
        if self.frames.try_take() > 0:
            log.warning("run %s: ping frame flood from %s, socket closed", self.run_id,
                        self.client)
            burst, rate = PING_FRAMES
            return close_frame(ProtocolError(
                TOO_OFTEN, f"ping flood: more than {burst} websocket pings at once or {rate:g} "
                "a second; one every few seconds is plenty", PING_FLOOD))
        if self.run is None:
            return self.rates.client_wait_s(self.client, PING_COST)
        return self.rates.wait_s(self.run, self.client, PING_COST)


def _check_steps(steps: int, *values: int | None) -> None:
    """Steps of a record, sample or hello are the run's: 0 .. steps."""
    bad = [v for v in values if v is not None and v > steps]
    if bad:
        raise ProtocolError(INVALID, f"step {max(bad)} is beyond this run's {steps} steps")


class _RunSources:
    """Which source_losses keys a run's records may carry: the corpus indices of the run's
    sources (its `sources`, every corpus source by default). Checked before a record is
    committed, since a bandit replays the committed records (data/run_registry.py)."""

    def __init__(self, data: DataHub, config: StoredRunConfig):
        self.data, self.picked = data, config.sources
        self.names: list[str] | None = None      # read on the first record with losses
        self.active: list[bool] = []

    async def check(self, records: list[Record]) -> None:
        for r in records:
            if not r.source_losses:
                continue
            if self.names is None:      # (read from disk the first time: off the loop)
                self.names = [s.name for s in await asyncio.to_thread(self.data.sources)]
                self.active = [not self.picked or n in self.picked for n in self.names]
            bad = sorted(k for k in r.source_losses
                         if source_index(k, len(self.names), self.active) is None)
            if bad:
                raise ProtocolError(INVALID, f"source_losses of step {r.step}: unknown source"
                                             f"{'s' * (len(bad) > 1)} {bad}; give the indices "
                                          "of the run's sources: "
                                          f"{sources_text(self.names, self.active)}. "
                                          "Nothing of this message was stored")


async def _receive(ws: WebSocket):
    """(the next message, its UTF-8 bytes)."""
    return await receive_sized(ws, TrainerMessage, MAX_MESSAGE_BYTES)


async def _first(ws: WebSocket, rates: MessageRates, client: str):
    """The first message (a hello, or not), within HELLO_TIMEOUT_S; paced before it is parsed,
    against the address alone (the socket is no run's yet): its bytes, at least HELLO_COST,
    whatever it is (a binary or too big one too: refused after the wait)."""
    refused = None
    try:
        text, size = await asyncio.wait_for(receive_text(ws, MAX_MESSAGE_BYTES),
                                            timeout=HELLO_TIMEOUT_S)
    except ProtocolError as e:
        refused, size = e, 0
    if wait := rates.client_wait_s(client, max(size, HELLO_COST)):
        await asyncio.sleep(wait)
    if refused is not None:
        raise refused
    return parse(TrainerMessage, text)


@router.websocket("/ws/runs/{run_id}")
async def trainer_socket(ws: WebSocket, run_id: str, store: StoreDep, fanout: FanoutDep,
                         runs: RunsDep, settings: SettingsDep, data: DataDep,
                         storage: StorageDep, rates: MessageRatesDep):
    connected = False
    committed = None        # the run's last committed step, as this socket knows it
    if not await accept(ws, settings, TRAINER_FRAME_BYTES):
        return
    client = ws.client.host if ws.client else ""
    pings = _PingFrames(rates, client, run_id)
    limit_pings(ws, pings)
    try:
        hello = await _first(ws, rates, client)
        if not isinstance(hello, Hello):
            raise ProtocolError(NOT_ALLOWED, "the first message must be hello with the run's token")
        async with fanout.run_lock(run_id):   # a resume cannot revoke between check and join
            verdict = await store.run(store.runs.check_token, run_id, hello.token)
            if verdict is None:
                raise ProtocolError(NOT_FOUND, f"unknown run {run_id!r}")
            if verdict == "revoked":
                raise ProtocolError(NOT_ALLOWED, REVOKED, REVOKED_TOKEN)
            if verdict != "ok":
                raise ProtocolError(NOT_ALLOWED, "wrong token for this run")
            run = await store.run(store.runs.get, run_id)
            if run["config"].room is not None:   # refused before it counts as the run's trainer
                raise ProtocolError(NOT_ALLOWED, "a room run is trained by the workers who join "
                                                 "it (its room: /api/runs/{id}/room), not by "
                                                 "one trainer")
            if not await fanout.claim_trainer(run_id):
                raise ProtocolError(CONFLICT, "another trainer holds this run", BUSY)
            connected = True
        pings.run = run_id
        if run["status"] in ("running", "paused"):
            # A tab back after a dropped connection: its viewers said "no training tab".
            fanout.publish(run_id, run_message(public_run(run, True)))
        steps = run["config"].steps
        sources = _RunSources(data, run["config"])
        n_tensors = tensor_count(run["config"])     # the per-tensor lists' length
        n_layer = layer_count(run["config"])        # the per-layer lists'
        # Quotas (quotas.py): the run's samples, counted from the store once, then here; its
        # records' rate, per socket.
        samples = SampleQuota(*await store.run(store.events.sample_usage, run_id),
                              settings.max_samples_per_run, settings.max_sample_bytes_per_run)
        rate = TokenBucket(settings.metrics_rate_per_s * METRICS_BURST_S,
                           settings.metrics_rate_per_s)
        # The bytes its records take in the store (storage.py), about, from a sample of them
        # (cheap for 1M records), then counted per message: against max_run_bytes.
        run_bytes = RunBytes(stored_run_bytes(*await store.run(store.metrics.usage, run_id)),
                             settings.max_run_bytes)
        _check_steps(steps, hello.last_acked_step)
        committed = run["last_step"]
        await ws.send_json({"type": "welcome", "records_per_message": RECORDS_PER_MESSAGE,
                            "max_message_bytes": MAX_MESSAGE_BYTES,
                            "last_committed_step": committed})
        while True:
            msg, size = await _receive(ws)
            # Past the run's or the client's bytes per second (or, below, the records per
            # second) the socket is read more slowly: nothing is refused or lost, the tab's
            # acks come later.
            wait = rates.wait_s(run_id, client, max(size, STATUS_COST if isinstance(msg, Status)
                                                    else PING_COST if isinstance(msg, Ping)
                                                    else MIN_COST))
            if isinstance(msg, Metrics):
                _check_steps(steps, *(r.step for r in msg.records))
                check_rows(run["config"].batch_size, msg.records)
                check_tensors(n_tensors, msg.records)
                check_inside(n_layer, msg.records)
                check_precision(run["config"].precision, msg.records)
                await sources.check(msg.records)    # before anything is committed
                if wait := max(wait, rate.take(len(msg.records))):
                    await asyncio.sleep(wait)
                # The storage budget, before the commit: StorageFull closes the socket with
                # nothing of this message stored.
                stores = message_bytes(msg.records, size)
                what = f"this message of {len(msg.records)} records"
                run_bytes.check(stores, what)
                await storage.take(stores, what)
                inserted, last = await store.metrics.add_grouped(
                    run_id, [r.row() for r in msg.records])
                run_bytes.add(stores * len(inserted) / len(msg.records))  # (resent: none)
                committed = last
                await ws.send_json({"type": "ack", "step": last})
                if inserted:    # exactly what was committed; a resend changes nothing
                    fanout.publish(run_id, {"type": "records", "records": inserted})
                if runs.has_bandit(run_id):   # (most runs have none: no thread trip)
                    try:    # off the loop: a bandit being made replays the store under its lock
                        await asyncio.to_thread(_feed_bandit, runs, run_id, msg.records)
                    except ValueError as e:
                        raise ProtocolError(INVALID, f"source_losses: {e}") from None
            elif isinstance(msg, Status):
                if wait:
                    await asyncio.sleep(wait)
                await storage.take(size, f"this status change to {msg.status}")
                now = await store.run(store.runs.set_status, run_id, msg.status, msg.message,
                                      msg.adapter, FINAL)
                if now != msg.status:
                    raise ProtocolError(CONFLICT, f"the run is {now}: a trainer cannot make it "
                                              f"{msg.status} again (resume it from a checkpoint"
                                              f" with POST /api/runs/{run_id}/resume, or branch)")
                fanout.publish(run_id, run_message(public_run(
                    await store.run(store.runs.get, run_id), True)))
            elif isinstance(msg, Sample):
                _check_steps(steps, msg.step)
                if wait:
                    await asyncio.sleep(wait)
                await storage.take(sample_bytes(msg.text), f"the sample of step {msg.step}")
                if not samples.take(msg.text):      # dropped; the trainer is told once
                    if not samples.told:
                        samples.told = True
                        log.warning("run %s: over its sample quota (%d samples, %d bytes); "
                                    "later samples are dropped", run_id, samples.count,
                                    samples.size)
                        await ws.send_json({"type": "notice", "message": samples.notice()})
                    continue
                await store.run(store.events.add, run_id, msg.step, "sample", {"text": msg.text})
                fanout.publish(run_id, {"type": "sample", "step": msg.step, "text": msg.text})
            elif isinstance(msg, Ping):
                if wait:
                    await asyncio.sleep(wait)
                await ws.send_json({"type": "pong"})
            else:
                raise ProtocolError(CONFLICT, "hello may only be sent once")
    except ProtocolError as e:
        await refuse(ws, e)
    except StorageFull as e:    # nothing of this message stored; the page keeps its unacked
        log.warning("run %s: %s", run_id, e)
        stored = "No records of the run are stored" if committed is None else \
            f"The run's records up to step {committed} are stored"
        await refuse(ws, ProtocolError(DISK_FULL, f"{e}. {stored}; the page keeps the ones not "
                                                  "acknowledged and tries again every 30 s: "
                                                  f"{STORAGE_NEXT[e.kind]}", e.kind))
    except StoreUnavailable as e:   # the page keeps its unacked records and comes back
        log.error("run %s: %s", run_id, e)
        await refuse(ws, ProtocolError(e.kind, f"{e}; the records not acknowledged are kept: "
                                               "free space or fix the data dir, the page "
                                               "reconnects"))
    except BrokerUnavailable as e:  # the other processes cannot be asked: come back later
        log.error("run %s: %s", run_id, e)
        await refuse(ws, e)
    except asyncio.TimeoutError:
        await refuse(ws, ProtocolError(NOT_ALLOWED, f"no hello within {HELLO_TIMEOUT_S} s"))
    except WebSocketDisconnect:
        pass
    finally:
        if connected:
            await fanout.release_trainer(run_id)
            fanout.spawn(publish_run(store, fanout, run_id))   # can_resume may be true now
            watch_trainer_gone(store, fanout, settings.trainer_grace_s, run_id)
