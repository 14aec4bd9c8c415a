"""Run registry: run_id -> BatchSpec, plus each bandit run's SourceBandit.

Specs live in memory and are restored on a miss from the runs store (a server restart loses no
run); a restored bandit replays the per-source losses that telemetry committed, so it decides
the same phases again. Ad hoc batch requests (`GET /api/batches/{step}?preset=...&seed=...`)
register their spec under a content-derived id, `adhoc-<hash>`, so they go through exactly the
same path as a real run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol

from andrea.data.bandit import SourceBandit
from andrea.data.spec import BatchSpec

log = logging.getLogger("andrea.data")

MAX_AD_HOC = 64                     # bounded: each holds a spec
MAX_AD_HOC_BANDITS = 8              # and of those, bandits (phases and reports: up to ~2 MB)
REPLAY_PAGE = 2000                  # committed records read at a time when a bandit is rebuilt
# How long a batch request waits for the telemetry its bandit phase depends on; past that it
# answers 503 and the page retries (the reports are a few hundred milliseconds behind at most).
# The default of Settings.batch_wait_s.
REPORT_WAIT_S = 10.0
# Batch requests of one run that may wait for its reports at once (each waits on the event loop,
# holding no thread); past this they are answered 503 with Retry-After at once.
MAX_WAITING = 8
# Steps: a batch whose phase needs reports further ahead than this of those arrived is answered
# at once, not after REPORT_WAIT_S: a trainer asks a few steps ahead of its last report (its
# prefetch, a few messages of records in flight), never thousands.
MAX_REPORT_LAG = 4096


class RunRows(Protocol):
    def get(self, run_id: str) -> dict | None: ...


class RunMetrics(Protocol):
    def page(self, run_id: str, after: int | None, limit: int | None) -> list[dict]: ...


class RunStore(Protocol):
    """What the registry reads from the runs store (store.Store): its runs' rows and their
    records."""

    @property
    def runs(self) -> RunRows: ...

    @property
    def metrics(self) -> RunMetrics: ...


class RunRegistry:
    def __init__(self, store: RunStore | None = None, wait_s: float = REPORT_WAIT_S):
        self._store = store
        self._wait_s = wait_s           # how long a batch may wait for its phase's reports
        self._specs: dict[str, BatchSpec] = {}
        self._ad_hoc: OrderedDict[str, None] = OrderedDict()
        self._bandits: dict[str, SourceBandit] = {}
        self._waiting: dict[str, int] = {}          # run -> its batch requests waiting now
        self._lock = threading.Lock()
        self._ad_hoc_key = secrets.token_bytes(32)     # this process's; see ad_hoc_token

    def ad_hoc_token(self, run_id: str) -> str:
        """The write token of an ad hoc run (its losses report): handed out with its batches
        (X-Andrea-Token), derived from a per-process secret, so it is never guessed from the
        run id that anyone can compute from the spec."""
        return hmac.new(self._ad_hoc_key, run_id.encode(), hashlib.sha256).hexdigest()

    def ad_hoc_token_ok(self, run_id: str, token: str) -> bool:
        return hmac.compare_digest(self.ad_hoc_token(run_id), token)

    def register(self, run_id: str, spec: BatchSpec) -> None:
        with self._lock:
            if run_id in self._specs and self._specs[run_id] != spec:
                raise ValueError(f"run {run_id!r} already exists with another spec")
            self._specs[run_id] = spec

    def get(self, run_id: str) -> BatchSpec | None:
        spec = self._specs.get(run_id)
        if spec is None and self._store is not None and not run_id.startswith("adhoc-"):
            run = self._store.runs.get(run_id)
            if run is not None:
                with self._lock:
                    spec = self._specs.setdefault(run_id, BatchSpec.of_run(run["config"]))
        return spec

    def register_ad_hoc(self, spec: BatchSpec) -> str:
        key = json.dumps(spec.to_dict(), sort_keys=True).encode()
        run_id = "adhoc-" + hashlib.sha256(key).hexdigest()[:16]
        with self._lock:
            self._specs[run_id] = spec
            self._ad_hoc[run_id] = None
            self._ad_hoc.move_to_end(run_id)
            while len(self._ad_hoc) > MAX_AD_HOC:
                old, _ = self._ad_hoc.popitem(last=False)
                self._specs.pop(old, None)
                self._bandits.pop(old, None)
            bandits = [r for r in self._ad_hoc if r in self._bandits]
            for old in bandits[:max(0, len(bandits) - MAX_AD_HOC_BANDITS)]:
                self._bandits.pop(old, None)    # made again (from no reports) if asked for
        return run_id

    def bandit(self, run_id: str, source_names: list[str]) -> SourceBandit | None:
        """The run's bandit, created on first use; None unless the run is in bandit mode."""
        spec = self.get(run_id)
        if spec is None or spec.mode != "bandit":
            return None
        with self._lock:
            if run_id not in self._bandits:
                real = self._store is not None and not run_id.startswith("adhoc-")
                # The run's picked sources (all by default). Lenient here: a name this corpus
                # lacks is refused with the batch (400), or the corpus mismatch first (409).
                active = [not spec.sources or n in spec.sources for n in source_names]
                bandit = SourceBandit(spec.seed, source_names,
                                      wait_s=self._wait_s if real else None, active=active)
                if real:
                    self._replay(run_id, bandit, None)
                    # Reports it waits for may have gone to another server process (its
                    # trainer is there): read from the store before waiting.
                    bandit.refill = lambda after: self._replay(run_id, bandit, after)
                self._bandits[run_id] = bandit
            return self._bandits[run_id]

    def start_waiting(self, run_id: str) -> bool:
        """Takes one of the run's MAX_WAITING places for a batch request that waits for its
        reports; False when they are all taken (answer at once). Give it back: stop_waiting."""
        with self._lock:
            if self._waiting.get(run_id, 0) >= MAX_WAITING:
                return False
            self._waiting[run_id] = self._waiting.get(run_id, 0) + 1
            return True

    def stop_waiting(self, run_id: str) -> None:
        with self._lock:
            left = self._waiting.pop(run_id, 1) - 1
            if left:
                self._waiting[run_id] = left

    def waiting(self, run_id: str) -> int:
        """The run's batch requests waiting for its reports now."""
        return self._waiting.get(run_id, 0)

    def has_bandit(self, run_id: str) -> bool:
        """Whether reports for the run have a bandit to go to now. Telemetry skips the thread
        trip when not: a bandit made later replays the committed records, and one that waits
        reads them from the store (refill)."""
        return run_id in self._bandits

    def _replay(self, run_id: str, bandit: SourceBandit, after: int | None) -> None:
        """The committed records after `after` reported to the bandit (reports are idempotent),
        page by page: a long run is never in memory at once. A stored key that names no source
        of the run (committed before the socket checked them) is skipped, and said once per
        replay: the rest of the record still counts, so such a run is never stuck on it."""
        skipped: list[tuple[int, str]] = []
        while page := self._store.metrics.page(run_id, after, REPLAY_PAGE):
            for rec in page:
                _report(bandit, rec["step"], rec.get("source_losses") or {}, skipped)
            after = page[-1]["step"]
        if skipped:
            step, key = skipped[0]
            log.warning("run %s: %d stored source loss%s skipped in the bandit's replay, the "
                        "first at step %d: %s", run_id, len(skipped),
                        "es" * (len(skipped) > 1), step, _why_not(bandit, key))

    def report_losses(self, run_id: str, step: int, losses: Mapping[str, float]) -> bool:
        """THE way per-source training losses reach a bandit: {source index: mean loss} at
        `step` (a telemetry record's source_losses). False when no bandit took them: the run is
        not in bandit mode, or its bandit does not exist yet (no batch served), in which case
        it replays the committed records when it is made. ValueError for an unknown source."""
        with self._lock:    # a bandit being made replays first: no report falls in between
            bandit = self._bandits.get(run_id)
        if bandit is None:
            return False
        _report(bandit, step, losses)
        return True

    def forget(self, run_id: str) -> None:
        """Drops the run's in-memory state (a resumed run's metrics after its checkpoint were
        deleted): the next use rebuilds it from the committed records."""
        with self._lock:
            self._specs.pop(run_id, None)
            self._bandits.pop(run_id, None)


def source_index(key: str, n_sources: int, active: Sequence[bool] | None = None) -> int | None:
    """The corpus index a source_losses key names, or None: not an ASCII decimal, past the
    corpus's `n_sources`, or a source the run did not pick (`active`, per corpus source)."""
    if not (key.isascii() and key.isdecimal()):
        return None
    i = int(key)
    if i >= n_sources or (active is not None and not active[i]):
        return None
    return i


def sources_text(names: Sequence[str], active: Sequence[bool] | None = None) -> str:
    """The run's sources as a message lists them: "0 (name), 2 (name)"."""
    return ", ".join(f"{i} ({name})" for i, name in enumerate(names)
                     if active is None or active[i])


def _why_not(bandit: SourceBandit, key: str) -> str:
    return (f"{key[:8]!r} is not the index of one of the run's sources "
            f"({sources_text(bandit.sources, bandit.active)})")


def _report(bandit: SourceBandit, step: int, losses: Mapping[str, float],
            skipped: list[tuple[int, str]] | None = None) -> None:
    """Reports `losses` at `step`. ValueError for a key that names no source of the run, unless
    `skipped` is given (a replay): then such a key is left out and listed there."""
    active = bandit.active.tolist()
    bad = sorted(k for k in losses if source_index(k, len(bandit.sources), active) is None)
    if bad and skipped is None:
        raise ValueError(f"unknown sources {bad}: give the indices of the run's sources: "
                         f"{sources_text(bandit.sources, active)}")
    for key in bad:
        skipped.append((step, key))
    bandit.report(step, {int(k): loss for k, loss in losses.items() if k not in bad})
