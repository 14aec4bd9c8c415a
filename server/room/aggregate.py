"""How a round's pseudo-gradients become one: the close's math, a function of the workers'
deltas read chunk by chunk (read(i, start, stop) -> f32), so memory holds a chunk of each,
never a whole delta (RobustMean takes any read(i, start, stop): arrays as well as files).

1. Norm clip from history. Each delta is scaled to at most clip_multiple x a reference norm:
   the median of this round's norms together with the norms that entered the last rounds
   (HISTORY_NORMS of them, after their own clip). A round's own median is set by whoever is
   the round's majority; the history is set by the rounds before, so one worker's 100x delta,
   or a round of two where one is hostile, moves the model no further than a typical one.
2. A mean of the deltas that agree with the round. Any minority leaves each honest worker at
   least p = n - 1 - f honest peers (f = ceil(n / 2) - 1, the most hostile workers a
   minority can be). A delta's score is its p-th highest cosine with the others: an honest
   one's is at most its agreement with an honest peer; a sign-flipped one's is negative
   (every honest delta points away from it), random noise's about 0, and colluders agreeing
   with each other are fewer than p. Deltas scoring below KEEP x the median score are
   dropped and the rest averaged: with every worker honest nobody is dropped and the round
   takes the plain mean (the averaging a room is for); with a hostile minority dropped,
   exactly the honest workers' mean. Measured and set aside (tests/api/test_room_hostile.py
   plays the same attackers): centred clipping around the median (Karimireddy et al. 2021),
   the coordinate-wise trimmed mean and median, and the cosine with the median. Adam's
   pseudo-gradients are sign-like and, early on, nearly orthogonal to one another (cosine
   ~0.1), so honest deltas differ from each other by about their own norm: no deviation
   threshold told a sign-flipper from them (1 of 4 took the room 57% of an honest step away,
   +5% eval loss), the median let it cancel every element where the honest split 2 to 1
   (+2.7%), and a median that counts the delta itself favoured random noise. With one or two
   workers this is the mean: two workers cannot tell which of them is honest, and the bounds
   only limit the damage.
3. Weighted by steps. In a round that was cut (rounds.Room.cut_now) a slow worker's delta
   covers fewer inner steps than the others': each is weighted by its steps (the tokens it
   trained), so a few steps of a slow laptop count as a few steps, not as a whole round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from andrea.room.codec import CHUNK

HISTORY_NORMS = 64       # post-clip norms of the last rounds kept for the clip's reference


KEEP = 0.5      # a delta is averaged when its score is at least this part of the median score


def products(x: np.ndarray):
    """x @ x.T of an f32 chunk (rows [n, chunk] -> their Gram matrix; one row [chunk] -> its
    |x|^2), summed by the caller in f64: BLAS's f32 products (4x faster than an f64 copy; 2e-5
    relative on 1M-element chunks, inside what the scores and the close's NORM_SLACK compare
    by), in f64 where they overflow f32 (values past ~1e19: an infinite norm broke a close)."""
    with np.errstate(over="ignore"):
        out = x @ x.T
    if not np.isfinite(out).all():
        x64 = x.astype(np.float64)
        out = x64 @ x64.T
    return out


class RobustMean:
    """The aggregate of n deltas of `numel` elements: `scales` (the norm clip), `limit`,
    `cosines` and `kept` are known once made (a first pass over the deltas when n >= 3);
    chunks() then yields the aggregate's chunks in order."""

    def __init__(self, read: Callable[[int, int, int], np.ndarray], norms: list[float],
                 numel: int, history: list[float], clip_multiple: float, chunk: int = CHUNK,
                 steps: list[int] | None = None):
        self.read, self.n, self.numel, self.chunk = read, len(norms), numel, chunk
        self.steps = [1] * self.n if steps is None else [int(s) for s in steps]
        self.norms = [float(x) for x in norms]
        self.reference = float(np.median(self.norms + [float(h) for h in history]))
        self.limit = clip_multiple * self.reference
        self.scales = [min(1.0, self.limit / x) if x > 0 else 1.0 for x in self.norms]
        self.cosines: list[float | None] = [None] * self.n   # each one's score
        self.kept = list(range(self.n))
        if self.n >= 3:       # below it no worker has an honest peer to be measured by
            gram = np.zeros((self.n, self.n), np.float64)
            for _, x in self._clipped(range(self.n)):
                gram += products(x)
            norm = np.sqrt(np.diag(gram))
            cos = gram / np.maximum(np.outer(norm, norm), 1e-300)
            peers = self.n - 1 - (-(-self.n // 2) - 1)
            self.cosines = [float(np.sort(np.delete(cos[i], i))[::-1][peers - 1])
                            for i in range(self.n)]
            typical = float(np.median(self.cosines))
            if typical > 0:
                self.kept = [i for i, c in enumerate(self.cosines) if c >= KEEP * typical]

    def clipped_norms(self) -> list[float]:
        """Each delta's norm as it entered (after the norm clip): the next rounds' history."""
        return [x * s for x, s in zip(self.norms, self.scales)]

    def norm_allowed(self) -> float:
        """The most the aggregate's norm can be from the accepted deltas: a mean of them is
        within the largest norm."""
        return max((self.clipped_norms()[i] for i in self.kept), default=0.0)

    def _clipped(self, which) -> Iterator[tuple[int, np.ndarray]]:
        """(start, x [len(which), chunk]: those deltas, norm-clipped) per chunk."""
        scale = np.array([self.scales[i] for i in which], np.float32)[:, None]
        for start in range(0, self.numel, self.chunk):
            stop = min(self.numel, start + self.chunk)
            x = np.stack([self.read(i, start, stop) for i in which])
            x *= scale
            yield start, x

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(start, the aggregate's f32 chunk) in order: the kept deltas' mean, weighted by their
        steps where those differ."""
        steps = np.array([self.steps[i] for i in self.kept], np.float32)
        equal = bool(np.all(steps == steps[0])) if steps.size else True
        for start, x in self._clipped(self.kept):
            if equal:
                yield start, x.mean(axis=0, dtype=np.float32)
            else:
                yield start, (steps @ x) / steps.sum()
