"""The source bandit (seed 001): mixing weights over sources, re-decided in phases.

Phases. Phase k lasts PHASE_LENGTHS[floor(u * 5)] steps, u = default_rng([seed, k, PHASE_SALT])
.random(): 7, 14, 21, 28 or 42 steps, reproducible from the seed alone. Short phases keep one
source from dominating; each boundary is a small distribution shift (and a gradient spike
that clipping caps), so boundaries are recorded for the charts.

Reward (what "the source is worth more training" means here). Telemetry reports, per step,
the mean training loss of the rows drawn from each source (`report(step, {source: loss})`).
    m[i, j] = mean reported loss of source i over the steps of phase j
    r[i, j] = (m[i, j'] - m[i, j]) / m[i, j']     j' = the latest earlier phase with reports for i
i.e. the relative decrease of the source's loss from one phase to the next: positive while the
model is still learning that source. Per source the estimate q[i] is an EMA (alpha REWARD_EMA)
of r[i, .] in phase order, 0 until the source has reports in two phases. Phase k uses the
estimates from phases <= k - 2 (see Determinism).

Weights. p = (1 - EXPLORE) * softmax(q / max(mean|q|, REWARD_SCALE_FLOOR)) + EXPLORE / K:
scale-free (equal progress gives equal weights however fast the loss falls), and every
source keeps at least EXPLORE / K of the rows so none starves and every estimate stays fresh.
K counts the run's sources: a run that picks some (its `sources`) mixes over those alone, and
the others get weight 0.

Determinism. Phase k's weights are a pure function of the seed and the reports of phases
<= k - 2: the whole phase before last, never whichever reports happen to have arrived. A batch
request in phase k (the trainer prefetches a few steps ahead while telemetry is still in
flight) waits until every step of those phases has been reported (`wait_s`), then decides and
freezes phase k. So an uninterrupted run, a run resumed from a checkpoint and a server restarted
mid-run (which replays the committed reports) all serve the same bytes for the same (run, step).
A one-phase gap (at least 7 steps) keeps the wait rare: those reports left the GPU long ago.
Bandits without telemetry (ad hoc batch requests) pass no `wait_s` and decide with what they have.
The HTTP route never blocks a thread on that wait: it asks `needs(step)` and `reported_to`, waits
on the event loop, and calls phase_at only once the phase can be decided (routes/data.py).
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

PHASE_LENGTHS = (7, 14, 21, 28, 42)
PHASE_SALT = 0x50484153             # "PHAS"
EXPLORE = 0.2
REWARD_EMA = 0.5
REWARD_SCALE_FLOOR = 0.01           # below 1% relative progress per phase, differences are noise


def phase_length(seed: int, k: int) -> int:
    u = np.random.default_rng([seed, k, PHASE_SALT]).random()
    return PHASE_LENGTHS[int(u * len(PHASE_LENGTHS))]


class PhaseSchedule:
    """Phase starts for one seed, extended lazily as later steps are asked about."""

    def __init__(self, seed: int):
        self.seed = seed
        self._starts = [0]              # only ever appended to, under the lock
        self._lock = threading.Lock()

    def _extend_past(self, step: int) -> None:
        with self._lock:
            while self._starts[-1] <= step:
                k = len(self._starts) - 1
                self._starts.append(self._starts[-1] + phase_length(self.seed, k))

    def phase(self, k: int) -> tuple[int, int]:
        """(start step, length) of phase k."""
        while len(self._starts) <= k + 1:
            self._extend_past(self._starts[-1])
        return self._starts[k], self._starts[k + 1] - self._starts[k]

    def locate(self, step: int) -> tuple[int, int, int]:
        """(phase index, start step, length) of the phase holding `step`."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self._extend_past(step)
        k = bisect.bisect_right(self._starts, step) - 1
        return k, self._starts[k], self._starts[k + 1] - self._starts[k]

    def phases_until(self, end_step: int) -> list[tuple[int, int, int]]:
        """Every phase that starts before end_step."""
        out, step = [], 0
        while step < end_step:
            k, start, length = self.locate(step)
            out.append((k, start, length))
            step = start + length
        return out


def mix_weights(q: np.ndarray) -> np.ndarray:
    z = q / max(float(np.mean(np.abs(q))), REWARD_SCALE_FLOOR)
    e = np.exp(z - z.max())
    return (1 - EXPLORE) * e / e.sum() + EXPLORE / q.size


@dataclass(frozen=True)
class Phase:
    index: int
    start: int
    length: int
    weights: tuple[float, ...]      # one per source, corpus order, sums to 1
    estimates: tuple[float, ...]    # q at decision time (why the weights are what they are)

    def to_dict(self) -> dict:
        return {"index": self.index, "start": self.start, "length": self.length,
                "weights": list(self.weights), "estimates": list(self.estimates)}


class NotReady(Exception):
    """A phase cannot be decided yet: reports of earlier steps are still in flight."""


class SourceBandit:
    """One run's bandit. Thread-safe: batch requests and telemetry reports come from threads.
    wait_s: how long a decision may wait for the reports it needs (None: decide with what is
    there, for bandits that get no telemetry). active: per source (corpus order), whether the
    run trains on it (a run's `sources`; default all): the weights are mixed over the active
    sources as if they were the whole corpus, and are 0 for the others."""

    def __init__(self, seed: int, sources: Sequence[str], wait_s: float | None = None,
                 active: Sequence[bool] | None = None):
        if not sources:
            raise ValueError("the bandit needs at least one source")
        self.sources = tuple(sources)
        self.active = np.ones(len(sources), bool) if active is None else np.array(active, bool)
        if self.active.shape != (len(sources),):
            raise ValueError(f"active: {self.active.size} flags for {len(sources)} sources")
        self.schedule = PhaseSchedule(seed)
        self.wait_s = wait_s
        self._phases: list[Phase] = []               # decided so far, frozen
        self._seen: set[tuple[int, int]] = set()     # (step, source): resends are ignored
        self._sums: dict[int, np.ndarray] = {}       # phase -> per-source [loss sum, count]
        self._reported_to = 0                        # steps 1..this have all been reported
        self._reported_after: set[int] = set()       # reported steps past that
        self._cond = threading.Condition()
        # Called with the last step reported without a gap before a decision waits: the
        # registry reads the reports from the store (those another server process received).
        self.refill: Callable[[int], None] | None = None

    def report(self, step: int, losses: Mapping[int, float]) -> None:
        """Step `step`'s record: {source (corpus index): its rows' mean training loss}. The step
        counts as reported once all of them are in, never between two sources (a decision then
        would miss the second one's loss). A non-finite loss says nothing about progress and is
        left out; the step still counts. Idempotent: a resent (step, source) is ignored."""
        losses = dict(losses)
        for source in losses:
            if not 0 <= source < len(self.sources):
                raise ValueError(f"source index {source} out of range [0, {len(self.sources)})")
        if step < 0:
            return
        k = self.schedule.locate(step)[0]
        with self._cond:
            for source, loss in losses.items():
                if (step, source) in self._seen or not math.isfinite(loss):
                    continue
                self._seen.add((step, source))
                acc = self._sums.setdefault(k, np.zeros((len(self.sources), 2)))
                acc[source] += (loss, 1.0)
            self._mark(step)

    def _mark(self, step: int) -> None:
        if step > self._reported_to:
            self._reported_after.add(step)
            while self._reported_to + 1 in self._reported_after:
                self._reported_to += 1
                self._reported_after.discard(self._reported_to)
            self._cond.notify_all()

    def estimates(self, before_phase: int) -> np.ndarray:
        """q per source from the reports of phases < before_phase (see module docstring)."""
        K = len(self.sources)
        q, last_mean, has_q = np.zeros(K), np.full(K, np.nan), np.zeros(K, bool)
        for j in sorted(k for k in self._sums if k < before_phase):
            s, n = self._sums[j][:, 0], self._sums[j][:, 1]
            for i in np.flatnonzero(n > 0):
                m = s[i] / n[i]
                if not np.isnan(last_mean[i]) and last_mean[i] > 0:
                    r = (last_mean[i] - m) / last_mean[i]
                    q[i] = r if not has_q[i] else REWARD_EMA * r + (1 - REWARD_EMA) * q[i]
                    has_q[i] = True
                last_mean[i] = m
        return q

    @property
    def reported_to(self) -> int:
        """Steps 1..this have all been reported."""
        return self._reported_to

    def _need(self, j: int) -> int:
        # Phase j depends on every step before phase j - 1 starts (records are 1-based).
        return self.schedule.phase(j - 1)[0] - 1 if j >= 2 else 0

    def needs(self, step: int) -> int:
        """The last step whose report deciding `step`'s phase waits for (0: none; always 0
        once it is decided, or for a bandit that does not wait): phase_at(step) waits for
        nothing once reported_to reaches it. (Costs a schedule extension up to `step`.)"""
        k = self.schedule.locate(step)[0]
        if self.wait_s is None or len(self._phases) > k:
            return 0
        return self._need(k)        # the most any phase up to k needs: needs grow with j

    def refill_to(self, step: int) -> None:
        """Reads the reports up to `step` from the store if they have not all arrived (those
        another server process received), before a wait."""
        if self.wait_s is not None and self._reported_to < step and self.refill:
            self.refill(self._reported_to)

    def phase_at(self, step: int) -> Phase:
        """The phase holding `step`, deciding it (and those before) if needed. NotReady if
        the reports it depends on do not arrive within wait_s."""
        k, _, _ = self.schedule.locate(step)
        with self._cond:
            while len(self._phases) <= k:
                j = len(self._phases)
                start, length = self.schedule.phase(j)
                need = self._need(j)
                if self.wait_s is not None and self._reported_to < need and self.refill:
                    self.refill(self._reported_to)
                if self.wait_s is not None and not self._cond.wait_for(
                        lambda: self._reported_to >= need, timeout=self.wait_s):
                    raise NotReady(f"phase {j} waits for the training losses of steps 1..{need}; "
                                   f"steps 1..{self._reported_to} have arrived")
                q = self.estimates(j - 1)
                if not self.active.any():
                    raise ValueError("the bandit has no source to train on")
                w = np.zeros(len(self.sources))
                w[self.active] = mix_weights(q[self.active])
                self._phases.append(Phase(j, start, length, tuple(w.tolist()), tuple(q.tolist())))
            return self._phases[k]

    def weights_at(self, step: int) -> np.ndarray:
        return np.asarray(self.phase_at(step).weights)

    def phases(self) -> list[Phase]:
        """Phases decided so far (what the charts mark), oldest first."""
        with self._cond:
            return list(self._phases)

    def phases_reported(self, total_steps: int) -> list[Phase]:
        """The phases decided so far, and at least those of every batch up to the one after the
        last step reported (capped at the run's last batch): the phases a run has trained in,
        also when its bandit was rebuilt (a server restart, a resume) and no batch was asked
        for since. Never waits: phase k needs only reports of steps before phase k - 1 starts.
        A bandit without telemetry (wait_s None) decides nothing here: it decides with the
        reports it has at its batches' time."""
        if self.wait_s is not None and self._reported_to > 0 and total_steps > 0:
            self.phase_at(min(self._reported_to, total_steps - 1))
        return self.phases()
