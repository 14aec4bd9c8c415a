"""Token windows, THE way batches are drawn: (spec, step, split) -> B rows of T + 1 tokens and
each row's source. (Not static/js/engine/sampler.js, which samples generated text.)

Randomness comes only from `np.random.default_rng([seed, step, salt])` and its `random()`
stream (PCG64 doubles, stable across numpy versions), never from global state, so the same
request gives the same bytes in any process, after any restart. Per training row:
    source = the first i with u0 * sum(w) < cumsum(w)[i]     (w: weights, 0 for a source too short)
    start  = floor(u1 * (n_train[source] - T))               (T + 1 tokens, all in the train part)
Validation rows come from each source's held-out tail (tokens.py) and depend only on the
index, not the run's seed, so runs with different seeds are scored on the same text. Rows go
round-robin over sources, so every eval batch measures every source.
A spec that picks sources (BatchSpec.sources, a run's `sources`) gives the others weight 0 and
leaves them out of the round-robin; row source indices stay the corpus's. Picking every source
gives the same bytes as picking none.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from andrea.data.spec import BatchSpec
from andrea.data.tokens import TokenFile

Split = Literal["train", "val"]
TRAIN_SALT = 0x54524149             # "TRAI": keeps these streams apart from other uses of the seed
VAL_SALT = 0x56414C31               # "VAL1"


def static_weights(spec: BatchSpec, n_sources: int) -> np.ndarray:
    """Weights for the modes that do not learn; bandit weights come from bandit.py."""
    if spec.mode == "uniform":
        return np.ones(n_sources)
    if spec.mode == "fixed":
        spec.check_sources(n_sources)
        return np.asarray(spec.weights, dtype=np.float64)
    raise ValueError("bandit weights depend on reported losses: pass them explicitly")


def source_mask(files: Sequence[TokenFile], spec: BatchSpec) -> np.ndarray:
    """(K,) bool: the sources the spec lets rows come from (all, unless it picks some)."""
    return np.array(spec.source_mask([f.name for f in files]), dtype=bool)


def _picked(spec: BatchSpec) -> str:
    return f" of the picked sources ({', '.join(spec.sources)})" if spec.sources else ""


def train_windows(files: Sequence[TokenFile], spec: BatchSpec, step: int,
                  weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source index [B], window start [B]) for a training step."""
    T, B = spec.seq_len, spec.batch_size
    n_train = np.array([f.n_train for f in files], dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64) * (n_train >= T + 1) * source_mask(files, spec)
    if not w.sum() > 0:
        raise ValueError(f"no source with a positive weight{_picked(spec)} has the "
                         f"{T + 1} training tokens a row needs (train tokens per source: "
                         f"{n_train.tolist()})")
    cdf = np.cumsum(w)
    u = np.random.default_rng([spec.seed, step, TRAIN_SALT]).random((2, B))
    src = np.searchsorted(cdf, u[0] * cdf[-1], side="right")
    src = np.minimum(src, np.flatnonzero(w > 0)[-1])   # u0 * sum rounding up to the total
    start = (u[1] * (n_train[src] - T)).astype(np.int64)
    return src, start


def val_windows(files: Sequence[TokenFile], spec: BatchSpec,
                index: int) -> tuple[np.ndarray, np.ndarray]:
    """(source index [B], window start [B]) for validation batch `index`."""
    T, B = spec.seq_len, spec.batch_size
    n_train = np.array([f.n_train for f in files], dtype=np.int64)
    n_val = np.array([f.n_val for f in files], dtype=np.int64)
    usable = np.flatnonzero((n_val >= T + 1) & source_mask(files, spec))
    if usable.size == 0:
        raise ValueError(f"no source{_picked(spec)} has the {T + 1} validation tokens a "
                         f"row needs (validation tokens per source: {n_val.tolist()})")
    src = usable[(index * B + np.arange(B)) % usable.size]
    u = np.random.default_rng([index, VAL_SALT]).random(B)
    start = n_train[src] + (u * (n_val[src] - T)).astype(np.int64)
    return src, start


def rows_problem(files: Sequence[TokenFile], spec: BatchSpec) -> str | None:
    """Why train_windows or val_windows would refuse this spec's batches, with the sizes (None:
    they serve them). A row is T + 1 tokens: training needs a source the run draws from
    (picked, with a positive weight) whose train part holds one, evaluation a picked source
    whose held-out tail does; a run that picks its sources needs each of them to hold both (a
    picked source too short would silently give no rows). POST /api/runs refuses such a run
    (422) and `andrea serve` warns when the largest preset's context does not fit, instead of
    every run failing at batch 0. Raises ValueError for a picked source the corpus lacks."""
    need = spec.seq_len + 1
    mask = source_mask(files, spec)
    n_train = np.array([f.n_train for f in files], dtype=np.int64)
    n_val = np.array([f.n_val for f in files], dtype=np.int64)
    vocab = f" at vocab {spec.vocab_size}"
    row = f"a row of seq_len {spec.seq_len} is {need:,} tokens (seq_len + 1)"
    advice = "give more text (--corpus) or ask for a shorter seq_len"

    def sizes(which) -> str:
        return ", ".join(f"{files[i].name}: {n_train[i]:,} training, {n_val[i]:,} held out"
                         for i in which)

    if spec.sources:
        short = [i for i in np.flatnonzero(mask) if min(n_train[i], n_val[i]) < need]
        if short:
            s = "s" * (len(short) > 1)
            return (f"{row}, more than the picked source{s} hold{'s' * (not s)}{vocab} "
                    f"({sizes(short)}): pick sources with more text, {advice}")
    weights = (np.asarray(spec.weights, dtype=np.float64) if spec.mode == "fixed"
               and len(spec.weights) == len(files) else np.ones(len(files)))
    drawn = np.flatnonzero(mask & (weights > 0))
    if not (n_train[drawn] >= need).any():
        return (f"{row}, and no source has that many training tokens{vocab} "
                f"({sizes(drawn)}): {advice}")
    if not (n_val[mask] >= need).any():
        return (f"{row}, and no source has that many held-out tokens{vocab} "
                f"({sizes(np.flatnonzero(mask))}): {advice}")
    return None


def sample_batch(files: Sequence[TokenFile], spec: BatchSpec, step: int, split: Split = "train",
                 weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """tokens (B, T + 1) uint32 and source index per row (B,) uint8.
    `step` is the training step, or the validation batch index when split == "val"."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if split == "train":
        if weights is None:
            weights = static_weights(spec, len(files))
        src, start = train_windows(files, spec, step, weights)
    elif split == "val":
        src, start = val_windows(files, spec, step)
    else:
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    rows = spec.seq_len + 1
    out = np.empty((spec.batch_size, rows), dtype=np.uint32)
    for r, (i, s) in enumerate(zip(src.tolist(), start.tolist())):
        out[r] = files[i].tokens[s:s + rows]
    return out, src.astype(np.uint8)


PASSES_WARNING = 4.0                # the form warns when a run reads a source more often than this


def data_budget(train_tokens: Sequence[int], batch_size: int, seq_len: int, steps: int,
                weights: Sequence[float] | None = None) -> dict:
    """How much text a run sees: tokens per step (B * T predicted tokens), in all, and the
    expected passes over each source's training part when rows go to sources by `weights`
    (uniform: equal; a source shorter than a row gets none, as in train_windows). The new-run
    form (static/js/app/new_run.js dataBudget) does the same arithmetic on /api/corpus."""
    n = np.asarray(train_tokens, dtype=np.float64)
    w = np.ones(len(n)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w * (n >= seq_len + 1)
    share = w / w.sum()
    total = batch_size * seq_len * steps
    passes = np.divide(total * share, n, out=np.zeros(len(n)), where=n > 0)
    return {"tokens_per_step": batch_size * seq_len, "total_tokens": total,
            "passes": passes.tolist(), "passes_overall": total / n.sum(),
            "warn": bool((passes > PASSES_WARNING).any())}
