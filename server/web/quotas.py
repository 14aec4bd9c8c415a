"""Quotas (Settings' run_burst, run_rate_per_s, max_runs, max_samples_per_run,
max_sample_bytes_per_run, metrics_rate_per_s, metrics_bytes_per_s, client_metrics_bytes_per_s,
and the readers' bounds:
max_exports_per_client, max_viewers_per_client, viewer_backlog_*) and their clear answers: a
token bucket (metrics per trainer socket), a rate limiter of token buckets keyed by client
address (new runs: 429 with Retry-After; the bytes of viewers' backlog reads: paced), slots per
client address (exports streamed at once: 429; viewer sockets open: closed 1008), trainer
messages' bytes per second per run and per client address (MessageRates: read more slowly),
and the samples a run may store. The data dir's free space and a run's bytes: storage.py.

All of it is in-process memory: with `--workers N` (or several servers on one database) each
process counts its own, so a client gets up to N times the rate; the stored counts (max_runs,
samples) are read from the database and hold across processes, give or take a race."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from fastapi import HTTPException

# Buckets kept per RateLimiter before the full ones (clients quiet long enough) are dropped:
# a flood of addresses cannot grow it without bound.
MAX_CLIENTS = 10_000
T = TypeVar("T")


class TokenBucket:
    """`burst` tokens, refilled at `rate_per_s`. take(n) always takes them (the bucket may go
    into debt) and says how long the caller should wait for the debt to be paid back."""

    def __init__(self, burst: float, rate_per_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.burst, self.rate, self.clock = float(burst), rate_per_s, clock
        self.tokens, self.at = self.burst, clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def take(self, n: float = 1) -> float:
        """Takes n tokens; the seconds until the bucket is out of debt again (0: none)."""
        self._refill()
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate)

    def try_take(self, n: float = 1) -> float:
        """Takes n tokens if the bucket holds them (returns 0), else takes nothing and returns
        the seconds until it will."""
        self._refill()
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate

    def full(self) -> bool:
        self._refill()
        return self.tokens >= self.burst


class RateLimiter:
    """A token bucket per client address, in this process (see the module's docstring)."""

    def __init__(self, burst: int, rate_per_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.burst, self.rate, self.clock = burst, rate_per_s, clock
        self.buckets: dict[str, TokenBucket] = {}

    def bucket(self, client: str) -> TokenBucket:
        """`client`'s bucket, made full on first use."""
        bucket = self.buckets.get(client)
        if bucket is None:
            if len(self.buckets) >= MAX_CLIENTS:    # a full bucket is the same as none
                self.buckets = {k: b for k, b in self.buckets.items() if not b.full()}
            bucket = self.buckets[client] = TokenBucket(self.burst, self.rate, self.clock)
        return bucket

    def wait_s(self, client: str) -> float:
        """0 (one token taken for `client`), or the seconds until it may try again."""
        return self.bucket(client).try_take()

    def check(self, client: str, what: str) -> None:
        """429 with Retry-After (whole seconds, at least 1) past the client's rate."""
        wait = self.wait_s(client)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise HTTPException(429, f"too many {what} from {client}: {self.burst} at once, "
                                     f"then one every {1 / self.rate:g} s; try again in "
                                     f"{retry} s", headers={"Retry-After": str(retry)})


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


# A trainer may send this many seconds' worth of its bytes per second at once.
BYTES_BURST_S = 2


class MessageRates:
    """Bytes per second of trainer messages (and pings: telemetry/trainer.py says what each
    costs): a bucket per run (kept across its sockets: a reconnect does not refill it) and one
    per client address (all trainer sockets from it share it). wait_s takes from both and says
    how long to wait before reading on; `paced` counts the messages that had to wait."""

    def __init__(self, per_run: float, per_client: float,
                 clock: Callable[[], float] = time.monotonic):
        self.runs = RateLimiter(per_run * BYTES_BURST_S, per_run, clock)
        self.clients = RateLimiter(per_client * BYTES_BURST_S, per_client, clock)
        self.paced = 0

    def wait_s(self, run_id: str, client: str, nbytes: int) -> float:
        """`nbytes` taken from the run's and the client's buckets (either may go into debt);
        the seconds until both are out of it again (0: none)."""
        wait = max(self.runs.bucket(run_id).take(nbytes),
                   self.clients.bucket(client).take(nbytes))
        self.paced += wait > 0
        return wait

    def client_wait_s(self, client: str, nbytes: int) -> float:
        """The same for what a socket sends before it is a run's (before its hello, which
        anyone may send for any run): from the client's bucket alone."""
        wait = self.clients.bucket(client).take(nbytes)
        self.paced += wait > 0
        return wait


def sample_bytes(text: str) -> int:
    """What a sample counts against max_sample_bytes_per_run: its event as stored (JSON, ASCII:
    events.sample_usage sums the same)."""
    return len(json.dumps({"text": text}))


class SampleQuota:
    """The samples one run may still store: its stored count and bytes (read once when its
    trainer connects), against Settings.max_samples_per_run and max_sample_bytes_per_run."""

    def __init__(self, count: int, size: int, max_count: int, max_bytes: int):
        self.count, self.size = count, size
        self.max_count, self.max_bytes = max_count, max_bytes
        self.told = False       # the trainer has had its one notice

    def take(self, text: str) -> bool:
        """True (counted): store it; False: over the quota, drop it."""
        n = sample_bytes(text)
        if self.count >= self.max_count or self.size + n > self.max_bytes:
            return False
        self.count, self.size = self.count + 1, self.size + n
        return True

    def notice(self) -> str:
        return (f"this run has stored {self.count} samples ({_mib(self.size)}), its quota is "
                f"{self.max_count} samples or {_mib(self.max_bytes)} "
                "(ANDREA_MAX_SAMPLES_PER_RUN, ANDREA_MAX_SAMPLE_BYTES_PER_RUN): later samples "
                "are not stored or shown; training and its records go on")


class ClientSlots:
    """At most `limit` of something held at once per client address (exports being streamed,
    open viewer sockets), in this process: take() gives a release function (idempotent), or
    None past the limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held: dict[str, int] = {}
        self._lock = threading.Lock()   # a release may come from a finalizer's thread

    def take(self, client: str) -> Callable[[], None] | None:
        with self._lock:
            if self.held.get(client, 0) >= self.limit:
                return None
            self.held[client] = self.held.get(client, 0) + 1
        released = []

        def release() -> None:
            with self._lock:
                if released:
                    return
                released.append(True)
                left = self.held[client] - 1
                if left:
                    self.held[client] = left
                else:
                    del self.held[client]
        return release


def app_state(app, name: str, make: Callable[[], T]) -> T:
    """app.state.<name>, made by `make` on first use: each app (each TestClient's) counts its
    own clients."""
    value = getattr(app.state, name, None)
    if value is None:
        value = make()
        setattr(app.state, name, value)
    return value
