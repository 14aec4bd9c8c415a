"""One batch for one run: weights (static or the bandit's), its token windows, the wire record."""

from __future__ import annotations

import numpy as np

from andrea import tasks
from andrea.data.bandit import SourceBandit
from andrea.data.hub import PreparedCorpus
from andrea.data.spec import BatchSpec
from andrea.data.windows import Split, sample_batch
from andrea.data.wire import Batch


class StepOutOfRange(ValueError):
    """A training step at or past the run's end."""


class CorpusMismatch(ValueError):
    """The run was made with other text than this server has."""


def corpus_mismatch(run_corpus: str, server_corpus: str) -> str | None:
    """Why a run made with `run_corpus` cannot train on a server with `server_corpus`, or None
    ("": a run of before corpus hashes, whatever the server has)."""
    if run_corpus and run_corpus != server_corpus:
        return (f"the run was made with corpus {run_corpus}, this server has {server_corpus}: "
                "train it on a server started with the same --corpus options")
    return None


def make_batch(corpus: PreparedCorpus | None, spec: BatchSpec, step: int,
               split: Split = "train", bandit: SourceBandit | None = None) -> Batch:
    """The batch of `step` (a training step, or a validation batch's index): from the corpus,
    or a task's problems (corpus None)."""
    if spec.task:
        if split == "train" and step >= spec.total_steps:
            raise StepOutOfRange(_past_end(step, spec))
        tokens = tasks.rows(spec.task, spec.task_digits, spec.seed, step, split,
                            spec.batch_size, spec.seq_len)
        return Batch(step, split, 1, None, np.zeros(spec.batch_size, np.uint8), tokens)
    if why := corpus_mismatch(spec.corpus_hash, corpus.corpus_hash):
        raise CorpusMismatch(why)
    spec.check_sources(len(corpus.files))
    spec.source_mask(corpus.source_names)      # a picked source this corpus lacks: ValueError
    if split == "train" and step >= spec.total_steps:
        raise StepOutOfRange(_past_end(step, spec))
    weights, phase = None, None
    if split == "train" and spec.mode == "bandit":
        if bandit is None:
            raise ValueError("a bandit-mode run needs its bandit")
        p = bandit.phase_at(step)
        weights, phase = p.weights, p.index
    tokens, sources = sample_batch(corpus.files, spec, step, split, weights)
    return Batch(step, split, len(corpus.files), phase, sources, tokens)


def _past_end(step: int, spec: BatchSpec) -> str:
    return (f"step {step} is beyond the run's end: it has {spec.total_steps} steps (0 to "
            f"{spec.total_steps - 1})")
