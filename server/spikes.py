"""Gradient spikes in a run's committed records: which steps, how far above the run's own level,
whether they came right after a bandit phase boundary (a shift of the data), and which rows of
the batch were furthest above the step's loss (outlier candidates).

A step is a spike when
- its grad norm is at least FACTOR times the running level: the median of the grad norms of the
  WINDOW steps before it (at least MIN_HISTORY of them). The median, not the mean, so that the
  spikes themselves do not lift the level they are judged by; a healthy run's norm moves by tens
  of percent from step to step, so three times its median is far outside that;
- or the clip fires (clip_scale < 1) after at least QUIET steps without clipping: with clipping
  on, a spike shows as the clip firing where it had stopped, whatever the ratio;
- or its grad norm is not finite (a NaN or an overflow in the gradients).

Pure: the route (routes/spikes.py) reads the records and adds each outlier row's source and text.
"""

from __future__ import annotations

import bisect
from collections import deque

WINDOW = 50          # steps of the running level
MIN_HISTORY = 10     # finite norms needed before any ratio is judged
FACTOR = 3.0         # a spike: grad norm >= FACTOR x the running level
QUIET = 20           # ... or the clip fires after this many steps without clipping
BOUNDARY = 3         # a spike at most this many steps after a phase change is "at a boundary"
TOP_ROWS = 3         # outlier candidates kept per spike


def find_spikes(records) -> list[dict]:
    """Spikes of `records` (in step order), as SpikeFinder lists them."""
    finder = SpikeFinder()
    for r in records:
        finder.feed(r)
    return finder.spikes


class SpikeFinder:
    """Fed a run's records in step order (a page at a time: a big run is never held whole);
    .spikes: {step, grad_norm, level, ratio, reasons, loss, clip_scale,
    boundary: {phase, previous, steps_after} | None, rows: [{row, loss, excess}]}."""

    def __init__(self):
        self.spikes: list[dict] = []
        self.recent: deque[float] = deque()   # the last WINDOW finite norms, in step order
        self.ordered: list[float] = []        # the same, sorted (for the median)
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
        ordered = self.ordered
        level = ordered[len(ordered) // 2] if len(ordered) >= MIN_HISTORY else None
        reasons = []
        if norm is None:
            reasons.append("non-finite grad norm")
        elif level and norm >= FACTOR * level:
            reasons.append(f"grad norm {norm / level:.1f}x the median of the last "
                           f"{len(ordered)} steps")
        clipped = clip is not None and clip < 1
        since = step - (self.last_clip if self.last_clip is not None else self.first_step - 1) - 1
        if clipped and level is not None and since >= QUIET:
            reasons.append(f"clipped after {since} steps without clipping")
        if reasons:
            self.spikes.append({
                "step": step, "grad_norm": norm, "level": level,
                "ratio": norm / level if norm is not None and level else None,
                "reasons": reasons, "loss": r.get("loss"), "clip_scale": clip,
                "boundary": _boundary(self.changes, step), "rows": outlier_rows(r)})
        if clipped:
            self.last_clip = step
        if norm is not None:
            self.recent.append(norm)
            bisect.insort(ordered, norm)
            if len(self.recent) > WINDOW:
                ordered.pop(bisect.bisect_left(ordered, self.recent.popleft()))


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
