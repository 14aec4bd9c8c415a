"""Run registry: run_id -> BatchSpec, plus each bandit run's SourceBandit.

Specs live in memory and are restored on a miss through `loader` (the SQLite runs table, so a
server restart loses no run); a restored bandit replays the per-source losses that telemetry
committed (`replay`), so it decides the same phases again. Ad hoc batch requests
(`GET /api/batches/{step}?preset=...&seed=...`) register their spec under a content-derived id,
`adhoc-<hash>`, so they go through exactly the same path as a real run.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from andrea.data.bandit import SourceBandit
from andrea.data.spec import BatchSpec

MAX_AD_HOC = 64                     # bounded: each holds a bandit's reports


class RunRegistry:
    def __init__(self, loader: Callable[[str], BatchSpec | None] | None = None,
                 replay: Callable[[str], Iterable[tuple[int, str, float]]] | None = None):
        self._loader = loader
        self._replay = replay
        self._specs: dict[str, BatchSpec] = {}
        self._ad_hoc: OrderedDict[str, None] = OrderedDict()
        self._bandits: dict[str, SourceBandit] = {}
        self._lock = threading.Lock()

    def register(self, run_id: str, spec: BatchSpec) -> None:
        with self._lock:
            if run_id in self._specs and self._specs[run_id] != spec:
                raise ValueError(f"run {run_id!r} already exists with another spec")
            self._specs[run_id] = spec

    def get(self, run_id: str) -> BatchSpec | None:
        spec = self._specs.get(run_id)
        if spec is None and self._loader is not None and not run_id.startswith("adhoc-"):
            spec = self._loader(run_id)
            if spec is not None:
                with self._lock:
                    self._specs.setdefault(run_id, spec)
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
        return run_id

    def bandit(self, run_id: str, source_names: list[str]) -> SourceBandit | None:
        """The run's bandit, created on first use; None unless the run is in bandit mode."""
        spec = self.get(run_id)
        if spec is None or spec.mode != "bandit":
            return None
        with self._lock:
            if run_id not in self._bandits:
                bandit = SourceBandit(spec.seed, source_names)
                for step, source, loss in (self._replay(run_id) if self._replay else ()):
                    bandit.report(step, source, loss)
                self._bandits[run_id] = bandit
            return self._bandits[run_id]

    def started_bandit(self, run_id: str) -> SourceBandit | None:
        """The run's bandit if its batches have been served (so it exists), else None."""
        return self._bandits.get(run_id)

    def report(self, run_id: str, step: int, source: int | str, loss: float,
               source_names: list[str]) -> bool:
        """Telemetry's entry point: a source's mean training loss at a step. False if ignored."""
        bandit = self.bandit(run_id, source_names)
        if bandit is None:
            return False
        bandit.report(step, source, loss)
        return True
