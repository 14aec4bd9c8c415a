"""Quotas (Settings' run_burst, run_rate_per_s, max_runs, max_samples_per_run,
max_sample_bytes_per_run, metrics_rate_per_s, min_free_bytes) and their clear answers: a token
bucket (metrics per trainer socket), a rate limiter of token buckets keyed by client address
(new runs: 429 with Retry-After), the samples a run may store, and the data dir's free-space
floor (507).

All of it is in-process memory: with `--workers N` (or several servers on one database) each
process counts its own, so a client gets up to N times the rate; the stored counts (max_runs,
samples) are read from the database and hold across processes, give or take a race."""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import HTTPException

# Buckets kept per RateLimiter before the full ones (clients quiet long enough) are dropped:
# a flood of addresses cannot grow it without bound.
MAX_CLIENTS = 10_000


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

    def wait_s(self, client: str) -> float:
        """0 (one token taken for `client`), or the seconds until it may try again."""
        bucket = self.buckets.get(client)
        if bucket is None:
            if len(self.buckets) >= MAX_CLIENTS:    # a full bucket is the same as none
                self.buckets = {k: b for k, b in self.buckets.items() if not b.full()}
            bucket = self.buckets[client] = TokenBucket(self.burst, self.rate, self.clock)
        return bucket.try_take()

    def check(self, client: str, what: str) -> None:
        """429 with Retry-After (whole seconds, at least 1) past the client's rate."""
        wait = self.wait_s(client)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise HTTPException(429, f"too many {what} from {client}: {self.burst} at once, "
                                     f"then one every {1 / self.rate:g} s; try again in "
                                     f"{retry} s", headers={"Retry-After": str(retry)})


def _existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists (a data dir not made yet)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def check_disk_floor(data_dir: Path, min_free_bytes: int, incoming: int, what: str) -> None:
    """507 when the data dir's free space less `incoming` bytes (an upload's size; 0 for a new
    run) would fall below `min_free_bytes` (Settings.min_free_bytes)."""
    free = shutil.disk_usage(_existing(data_dir)).free
    if free - incoming < min_free_bytes:
        size = f" of {_mib(incoming)}" if incoming else ""
        raise HTTPException(507, f"not enough disk space for {what}{size}: the data dir "
                                 f"{data_dir} has {_mib(free)} free and keeps at least "
                                 f"{_mib(min_free_bytes)} (ANDREA_MIN_FREE_BYTES); free space "
                                 "or delete runs you no longer need, then try again. Nothing "
                                 "was stored")


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
