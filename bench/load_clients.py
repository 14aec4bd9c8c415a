"""The clients of bench/load.py, run inside its worker processes: trainer and viewer sockets
that speak the telemetry protocol (server/telemetry/protocol.py) as the page does
(static/js/app/telemetry.js), and the worker that runs a share of them on one event loop.

Every client logs wall-clock times (time.time(): all processes are on one machine) per step:
a trainer when it first sent each record and when it was acked, a viewer when it received each
step. The parent process (load.py) merges those logs into latencies after the run.

A worker talks to the parent over a multiprocessing Pipe:
  worker -> ("ready", pid)            imported, clients built
  parent -> t0                        wall-clock start of the schedule
  worker -> ("acked", {run: step})    its trainers are done (every record acked, or timed out)
  parent -> {run: step}               every run's last acked step: viewers wait for it
  worker -> ("result", {...})         the logs
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
from array import array
from collections import deque
from dataclasses import dataclass

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

FIRST_RETRY_S, MAX_RETRY_S = 0.5, 8.0      # the page's reconnect backoff
BUSY_RETRIES = 8                           # "another trainer holds this run", retried (page)
SAMPLE_TEXT = "def load(path):\n    with open(path) as f:\n        return f.read()\n" * 3
ADAPTER = {"vendor": "bench", "architecture": "load.py", "description": "load generator",
           "software": True}


@dataclass
class Schedule:
    """Wall-clock plan shared by every client (all times relative to t0, in seconds)."""
    warmup: float
    duration: float
    interval: float          # seconds between a trainer's records
    flush_s: float           # 0: send each record at once
    drain_s: float           # bound on waiting for the last acks, then on viewers catching up
    sample_every: int        # a text sample every this many steps (the run config's default)
    eval_every: int

    def end(self, t0: float) -> float:
        return t0 + self.warmup + self.duration


def _connect(url: str, origin: str):
    # Like a browser: permessage-deflate offered (the default), an Origin, no client pings
    # (a page never pings; the server's pings are answered), no proxy (loopback only).
    return connect(url, origin=origin, proxy=None, ping_interval=None, open_timeout=15,
                   close_timeout=5, max_size=None)


def _close_code(e: BaseException) -> tuple[int, str]:
    if isinstance(e, ConnectionClosed) and e.rcvd is not None:
        return e.rcvd.code, e.rcvd.reason
    return 1006, f"{type(e).__name__}: {e}"[:200]     # what a browser reports: abnormal


class Trainer:
    """One training tab: records every `interval`, kept until acked, flushed every flush_s,
    resent after a reconnect (everything after the welcome's last_committed_step)."""

    def __init__(self, spec: dict, sched: Schedule):
        self.run_id, self.token = spec["run"], spec["token"]
        self.url = spec["ws"] + f"/ws/runs/{self.run_id}"
        self.origin, self.max_step = spec["origin"], spec["steps"]
        self.sched, self.offset = sched, spec["start"]
        self.unacked: deque[dict] = deque()     # records in step order, not yet committed
        self.control: deque[dict] = deque([{"type": "status", "status": "running",
                                            "adapter": ADAPTER}])
        self.last_acked: int | None = None
        self.sent_up_to: int | None = None
        self.per_message = 1
        self.ws = None
        self.kick = asyncio.Event()             # flush now (flush_s == 0, or at the end)
        self.pong = asyncio.Event()
        self.produced = 0
        self.made_t: dict[int, float] = {}      # step -> when the record was made
        self.send_t: dict[int, float] = {}      # step -> first send (wall clock)
        self.ack_t: dict[int, float] = {}       # step -> when its ack came
        self.resent = 0
        self.connects = 0
        self.closes: list[int] = []
        self.error: str | None = None
        self.rng = random.Random(self.run_id)

    # ---- records -----------------------------------------------------------------------
    def record(self, step: int) -> dict:
        """A realistic step record of the tiny preset (only fields metrics.Record accepts)."""
        r = self.rng
        loss = 8.0 * math.exp(-step / 400) + 1.5 + r.uniform(-0.05, 0.05)
        norm = r.uniform(0.3, 2.0)
        ms = r.uniform(40, 60)
        rec = {"step": step, "loss": loss, "grad_norm": norm, "clip_scale": min(1.0, 1 / norm),
               "lr": 3e-3 * min(1.0, step / 20), "tokens_per_s": 8 * 128 * 1000 / ms,
               "step_ms": ms, "opt_ms": ms / 20,
               "source_losses": {"0": loss + r.uniform(-.1, .1), "1": loss + r.uniform(-.1, .1)}}
        if self.sched.eval_every and step % self.sched.eval_every == 0:
            rec["eval_loss"] = loss + 0.1
        return rec

    async def produce(self, t0: float) -> None:
        """Records on a fixed clock from this trainer's start to the end of the window (a late
        loop catches up, so the rate is the asked one)."""
        start, end = t0 + self.offset, self.sched.end(t0)
        step = 0
        while step < self.max_step:
            due = start + step * self.sched.interval
            if due >= end:
                break
            await asyncio.sleep(max(0.0, due - time.time()))
            step += 1
            self.unacked.append(self.record(step))
            self.made_t[step] = time.time()
            self.produced = step
            if self.sched.sample_every and step % self.sched.sample_every == 0:
                self.control.append({"type": "sample", "step": step, "text": SAMPLE_TEXT})
            if self.sched.flush_s == 0:
                self.kick.set()

    # ---- the socket ----------------------------------------------------------------------
    def mark_acked(self, step: int | None) -> None:
        if step is None:
            return
        now = time.time()
        self.last_acked = max(self.last_acked if self.last_acked is not None else -1, step)
        while self.unacked and self.unacked[0]["step"] <= self.last_acked:
            s = self.unacked.popleft()["step"]
            if s in self.send_t:
                self.ack_t.setdefault(s, now)

    async def flush(self, ws) -> None:
        while self.control:
            await ws.send(json.dumps(self.control.popleft()))
        fresh = [r for r in self.unacked if self.sent_up_to is None or r["step"] > self.sent_up_to]
        for i in range(0, len(fresh), self.per_message):
            chunk = fresh[i:i + self.per_message]
            now = time.time()
            for r in chunk:
                if r["step"] in self.send_t:
                    self.resent += 1
                else:
                    self.send_t[r["step"]] = now
            await ws.send(json.dumps({"type": "metrics", "records": chunk}))
        if fresh:
            self.sent_up_to = fresh[-1]["step"]

    async def flusher(self, ws) -> None:
        while True:
            if self.sched.flush_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.kick.wait(), self.sched.flush_s)
            else:
                await self.kick.wait()
            self.kick.clear()
            await self.flush(ws)

    def handle(self, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "welcome":
            self.per_message = msg["records_per_message"]
            self.mark_acked(msg["last_committed_step"])
            self.sent_up_to = self.last_acked    # resend everything after the committed step
        elif kind == "ack":
            self.mark_acked(msg["step"])
        elif kind == "pong":
            self.pong.set()
        elif kind == "error":
            self.error = msg.get("message")

    async def session(self) -> None:
        """One connection: hello, welcome, then acks in and flushes out until it closes."""
        async with _connect(self.url, self.origin) as ws:
            self.ws = ws
            await ws.send(json.dumps({"type": "hello", "token": self.token,
                                      "last_acked_step": self.last_acked}))
            welcome = json.loads(await ws.recv())
            if welcome.get("type") != "welcome":
                self.handle(welcome)
                await ws.recv()                  # the close that follows an error
                return
            self.handle(welcome)
            self.connects += 1
            await self.flush(ws)
            flusher = asyncio.ensure_future(self.flusher(ws))
            try:
                while True:
                    self.handle(json.loads(await ws.recv()))
            finally:
                flusher.cancel()
                with contextlib.suppress(BaseException):
                    await flusher

    async def connection(self) -> None:
        """Connects and reconnects as the page does, until cancelled or refused."""
        retry, busy = FIRST_RETRY_S, 0
        while True:
            welcomed = self.connects
            try:
                await self.session()
                code, reason = 1000, ""
            except (ConnectionClosed, OSError, InvalidHandshake, TimeoutError) as e:
                code, reason = _close_code(e)
            self.ws = None
            self.closes.append(code)
            if self.connects > welcomed:          # a welcome resets the backoff (page)
                retry, busy = FIRST_RETRY_S, 0
            is_busy = code == 1008 and "another trainer" in reason and busy < BUSY_RETRIES
            busy += is_busy
            if code in (1008, 1003) and not is_busy:
                self.error = f"refused: {code} {reason}"
                return
            await asyncio.sleep(retry)
            retry = min(retry * 2, MAX_RETRY_S)

    async def run(self, t0: float) -> None:
        """Produce until the end of the window, then wait (bounded) for every ack, tell the
        server the run stopped, sync with a ping, close."""
        await asyncio.sleep(max(0.0, t0 + self.offset - time.time()))
        conn = asyncio.ensure_future(self.connection())
        try:
            await self.produce(t0)
            deadline = self.sched.end(t0) + self.sched.drain_s
            while (self.unacked or self.ws is None) and time.time() < deadline \
                    and not conn.done():
                self.kick.set()
                await asyncio.sleep(0.05)
            if self.ws is not None and not self.unacked:
                self.control.extend([{"type": "status", "status": "stopped"}, {"type": "ping"}])
                self.kick.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.pong.wait(), max(1.0, deadline - time.time()))
        finally:
            conn.cancel()
            with contextlib.suppress(BaseException):
                await conn

    def result(self) -> dict:
        steps = sorted(self.send_t)
        return {"run": self.run_id, "produced": self.produced, "last_acked": self.last_acked,
                "steps": array("i", steps), "send_t": array("d", [self.send_t[s] for s in steps]),
                "made_t": array("d", [self.made_t[s] for s in steps]),
                "ack_t": array("d", [self.ack_t.get(s, math.nan) for s in steps]),
                "unacked": len(self.unacked), "resent": self.resent, "connects": self.connects,
                "closes": self.closes, "error": self.error}


class Viewer:
    """One run page watching: records in, its cursor `last` asked for on every reconnect
    (?after=last), a live `resumed` moves it back. Every step received is logged once; a
    step received again is a duplicate."""

    def __init__(self, spec: dict):
        self.run_id = spec["run"]
        self.base = spec["ws"] + f"/ws/runs/{self.run_id}/watch"
        self.origin, self.offset = spec["origin"], spec["start"]
        self.last: int | None = None
        self.recv_t: dict[int, float] = {}      # step -> first receipt (wall clock)
        self.dups = 0
        self.messages = 0
        self.connects = 0
        self.closes: list[int] = []
        self.final = False                      # the run's last acked step is known
        self.target: int | None = None          # that step (None: nothing was acked)
        self.refused: str | None = None

    @property
    def done(self) -> bool:
        if self.refused is not None:
            return True
        return self.final and (self.target is None
                               or (self.last is not None and self.last >= self.target))

    def handle(self, raw: str | bytes, now: float) -> None:
        msg = json.loads(raw)
        self.messages += 1
        kind = msg.get("type")
        if kind == "records" and msg["records"]:
            for r in msg["records"]:
                if r["step"] in self.recv_t:
                    self.dups += 1
                else:
                    self.recv_t[r["step"]] = now
            self.last = max(self.last if self.last is not None else -1, msg["records"][-1]["step"])
        elif kind == "resumed" and "kind" not in msg and self.last is not None:
            # A live resume notice (a backlog event has "kind"): records after it are replaced.
            self.last = min(self.last, msg["step"])
            for s in [s for s in self.recv_t if s > msg["step"]]:
                del self.recv_t[s]

    async def session(self) -> None:
        after = "" if self.last is None else f"?after={self.last}"
        async with _connect(self.base + after, self.origin) as ws:
            self.connects += 1
            while True:
                raw = await ws.recv()
                self.handle(raw, time.time())

    async def run(self, t0: float) -> None:
        """Watches until cancelled; reconnects as the page does (1013: at once, after its
        last step; 1008 and 1003 are final)."""
        await asyncio.sleep(max(0.0, t0 + self.offset - time.time()))
        retry = FIRST_RETRY_S
        while True:
            try:
                await self.session()
                code, reason = 1000, ""
            except (ConnectionClosed, OSError, InvalidHandshake, TimeoutError) as e:
                code, reason = _close_code(e)
            self.closes.append(code)
            if code in (1008, 1003):
                self.refused = f"{code} {reason}"
                return
            await asyncio.sleep(0.1 if code == 1013 else retry)
            retry = FIRST_RETRY_S if code == 1013 else min(retry * 2, MAX_RETRY_S)

    def result(self) -> dict:
        steps = sorted(self.recv_t)
        return {"run": self.run_id, "steps": array("i", steps),
                "recv_t": array("d", [self.recv_t[s] for s in steps]), "dups": self.dups,
                "messages": self.messages, "connects": self.connects, "closes": self.closes,
                "last": self.last, "target": self.target, "refused": self.refused}


async def _loop_lag(samples: list[tuple[float, float]]) -> None:
    """How late this worker's loop wakes up (a late loop inflates every latency it logs)."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(0.1)
        samples.append((time.time(), max(0.0, time.monotonic() - t - 0.1)))


async def _recv(conn):
    return await asyncio.get_running_loop().run_in_executor(None, conn.recv)


async def _worker(conn, spec: dict) -> None:
    sched = Schedule(**spec["schedule"])
    trainers = [Trainer(s, sched) for s in spec["trainers"]]
    viewers = [Viewer(s) for s in spec["viewers"]]
    conn.send(("ready", os.getpid()))
    t0 = await _recv(conn)
    lag: list[tuple[float, float]] = []
    lag_task = asyncio.ensure_future(_loop_lag(lag))
    watching = [asyncio.ensure_future(v.run(t0)) for v in viewers]
    await asyncio.gather(*(t.run(t0) for t in trainers))
    conn.send(("acked", {t.run_id: t.last_acked for t in trainers}))
    final = await _recv(conn)
    for v in viewers:
        v.target, v.final = final.get(v.run_id), True
    deadline = time.time() + sched.drain_s
    while not all(v.done for v in viewers) and time.time() < deadline:
        await asyncio.sleep(0.05)
    for task in watching + [lag_task]:
        task.cancel()
    await asyncio.gather(*watching, lag_task, return_exceptions=True)
    conn.send(("result", {"pid": os.getpid(), "trainers": [t.result() for t in trainers],
                          "viewers": [v.result() for v in viewers],
                          "loop_lag": array("d", [x for _, x in lag]),
                          "loop_lag_t": array("d", [t for t, _ in lag])}))


def worker_main(conn, spec: dict) -> None:
    """A worker process's entry point (multiprocessing, spawn)."""
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_worker(conn, spec))
    except BaseException as e:           # the parent reports it; a dead worker is no result
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise
