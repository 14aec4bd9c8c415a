"""Gradient spikes in a run's committed records: which steps, how far above the run's own level,
whether they came right after a bandit phase boundary (a shift of the data), which rows of the
batch were furthest above the step's loss (outlier candidates), and the spike's anatomy
(spike_anatomy.py): the tensors and the layer that carry its gradient, its non-finite
elements, and numerical flags (non-finite gradients, a collapsed softmax, grown logits).

A step is a spike when
- its grad norm is at least FACTOR times the running level: the median of the grad norms of the
  WINDOW steps before it (at least MIN_HISTORY of them). The median, not the mean, so that the
  spikes themselves do not lift the level they are judged by; a healthy run's norm moves by tens
  of percent from step to step, so three times its median is far outside that;
- or the clip fires (clip_scale < 1) after at least QUIET steps without clipping: with clipping
  on, a spike shows as the clip firing where it had stopped, whatever the ratio;
- or its grad norm is not finite (a NaN or an overflow in the gradients);
- or its gradients hold non-finite elements (grad_nonfinite > 0), even with a finite grad norm:
  the trainer leaves them out of the norm. A numerical edge case, not the data's doing.
The logits' running level (for the logit_growth flag) is kept the same way as the grad norm's.

Pure: the route (routes/spikes.py) reads the records, passes the run's tensors (its layout's
parameter entries, in order) and adds each outlier row's source and text.
"""

from __future__ import annotations

import bisect
from collections import deque

from andrea.spike_anatomy import anatomy

WINDOW = 50          # steps of the running level
MIN_HISTORY = 10     # finite norms needed before any ratio is judged
FACTOR = 3.0         # a spike: grad norm >= FACTOR x the running level
QUIET = 20           # ... or the clip fires after this many steps without clipping
BOUNDARY = 3         # a spike at most this many steps after a phase change is "at a boundary"
TOP_ROWS = 3         # outlier candidates kept per spike


def find_spikes(records, tensors: list[dict] | None = None) -> list[dict]:
    """Spikes of `records` (in step order), as SpikeFinder lists them."""
    finder = SpikeFinder(tensors)
    for r in records:
        finder.feed(r)
    return finder.spikes


class RunningMedian:
    """The median of the last WINDOW values added (None while fewer than MIN_HISTORY)."""

    def __init__(self):
        self.recent: deque[float] = deque()   # the last WINDOW values, in step order
        self.ordered: list[float] = []        # the same, sorted

    def __len__(self) -> int:
        return len(self.ordered)

    def level(self) -> float | None:
        ordered = self.ordered
        return ordered[len(ordered) // 2] if len(ordered) >= MIN_HISTORY else None

    def add(self, value: float) -> None:
        self.recent.append(value)
        bisect.insort(self.ordered, value)
        if len(self.recent) > WINDOW:
            self.ordered.pop(bisect.bisect_left(self.ordered, self.recent.popleft()))


class SpikeFinder:
    """Fed a run's records in step order (a page at a time: a big run is never held whole);
    .spikes: {step, grad_norm, level, level_steps, ratio, reasons, kinds, loss, clip_scale,
    boundary: {phase, previous, steps_after} | None, rows: [{row, loss, excess}],
    logit_max, softmax_denom_min, numerical: [{flag, text}], and where the record has them
    tensors: [{index, name, norm, share}], layer: {name, norm, share} | None,
    nonfinite: {total, affected, tensors: [{index, name, count}]}} (spike_anatomy.py).
    `level_steps`: how many steps' norms the level is the median of (WINDOW, fewer early on);
    `kinds`: what each reason is, in the same order ("ratio", "nonfinite_norm",
    "nonfinite_elements", "clip"), so that a page can tell a spike judged by its ratio from one
    whose ratio is below FACTOR.
    `tensors`: the run's layout's parameter entries (name, layer), in order (None: tensors
    unnamed)."""

    def __init__(self, tensors: list[dict] | None = None):
        self.tensors = tensors
        self.spikes: list[dict] = []
        self.norms = RunningMedian()           # of the finite grad norms
        self.logits = RunningMedian()          # of the largest |logit| of each step
        self.denoms = RunningMedian()          # of the smallest softmax denominator
        self.last_clip: int | None = None
        self.first_step: int | None = None
        self.last_phase: tuple[int, int] | None = None    # (step, phase) of the last record
        self.changes: list[tuple[int, int, int]] = []     # (step, new phase, previous phase)

    def feed(self, r: dict) -> None:
        step, norm, clip = r["step"], r.get("grad_norm"), r.get("clip_scale")
        self.first_step = step if self.first_step is None else self.first_step
        phase = r.get("phase")
        if phase is not None:
            if self.last_phase and self.last_phase[0] == step - 1 and self.last_phase[1] != phase:
                self.changes.append((step, phase, self.last_phase[1]))
            self.last_phase = (step, phase)
        if r.get("skipped"):
            # A mixed-precision step whose gradient overflowed under the loss scale: its update
            # was skipped and the scale halved (GradScaler's search for the scale), not a spike.
            return
        level = self.norms.level()
        reasons, kinds = [], []
        if norm is None:
            reasons.append("non-finite grad norm")
            kinds.append("nonfinite_norm")
        elif level and norm >= FACTOR * level:
            reasons.append(f"grad norm {norm / level:.1f}x the median of the last "
                           f"{len(self.norms)} steps")
            kinds.append("ratio")
        bad = r.get("grad_nonfinite") or 0
        if bad > 0:
            reasons.append(f"{bad} non-finite gradient element{'s' * (bad != 1)}")
            kinds.append("nonfinite_elements")
        clipped = clip is not None and clip < 1
        since = step - (self.last_clip if self.last_clip is not None else self.first_step - 1) - 1
        if clipped and level is not None and since >= QUIET:
            reasons.append(f"clipped after {since} steps without clipping")
            kinds.append("clip")
        if reasons:
            self.spikes.append({
                "step": step, "grad_norm": norm, "level": level, "level_steps": len(self.norms),
                "ratio": norm / level if norm is not None and level else None,
                "reasons": reasons, "kinds": kinds, "loss": r.get("loss"), "clip_scale": clip,
                "boundary": _boundary(self.changes, step), "rows": outlier_rows(r),
                **anatomy(r, self.tensors, self.logits.level(), len(self.logits),
                          self.denoms.level())})
        if clipped:
            self.last_clip = step
        if norm is not None:
            self.norms.add(norm)
        if r.get("logit_max") is not None:
            self.logits.add(r["logit_max"])
        if r.get("softmax_denom_min") is not None:
            self.denoms.add(r["softmax_denom_min"])


def _boundary(changes: list[tuple[int, int, int]], step: int) -> dict | None:
    """The latest phase change at or before `step`, if it is at most BOUNDARY steps back."""
    for at, phase, previous in reversed(changes):
        if at <= step:
            return ({"phase": phase, "previous": previous, "steps_after": step - at}
                    if step - at <= BOUNDARY else None)
    return None


def outlier_rows(record: dict) -> list[dict]:
    """The TOP_ROWS rows of the step's batch furthest above its loss: {row, loss, excess}.
    Non-finite rows (None) first: they are the most suspect of all."""
    rows = record.get("row_losses") or []
    loss = record.get("loss")
    found = [{"row": i, "loss": x, "excess": None if x is None or loss is None else x - loss}
             for i, x in enumerate(rows)]
    found.sort(key=lambda f: (f["loss"] is not None, -(f["excess"] or 0.0)))
    return found[:TOP_ROWS]
