"""BatchSpec: everything that decides a run's batches, and nothing else.

Frozen and plain (ints, strings, a tuple of floats) so the runs store can keep it as one JSON
column and a replay or a PyTorch reproduction can rebuild the same batches from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, Sequence, get_args

from andrea.data.shards import batch_steps
from andrea.run_config import StoredRunConfig
from andrea.tasks import task_digits

Mode = Literal["uniform", "fixed", "bandit"]
MODES: tuple[str, ...] = get_args(Mode)
MAX_STEPS = 1_000_000_000           # the batch header stores the step as a u32
MAX_BATCH_TOKENS = 16 * 1024 * 1024 # B * (T + 1) bound: 64 MiB of u32 per response


@dataclass(frozen=True)
class BatchSpec:
    seed: int                       # with the step, all the randomness there is
    batch_size: int                 # B rows
    seq_len: int                    # T: each row holds T + 1 tokens (inputs and shifted targets)
    vocab_size: int                 # V: picks the tokenizer and token files
    total_steps: int                # training steps are 0 .. total_steps - 1
    mode: Mode = "uniform"          # how rows are spread over sources
    weights: tuple[float, ...] = () # "fixed" only: one weight >= 0 per source, corpus order
    corpus_hash: str = ""           # the run's corpus; "" = whatever the server has
    sources: tuple[str, ...] = ()   # the sources rows come from, by name; () = every one
    task: str = ""                  # a toy task's problems instead of the corpus (tasks.py)
    task_digits: int = 0            # its digits (0 with no task)

    def __post_init__(self):
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2^63), got {self.seed}")
        if not 1 <= self.batch_size <= 4096:
            raise ValueError(f"batch_size must be in [1, 4096], got {self.batch_size}")
        if not 1 <= self.seq_len <= 65536:
            raise ValueError(f"seq_len must be in [1, 65536], got {self.seq_len}")
        if self.batch_size * (self.seq_len + 1) > MAX_BATCH_TOKENS:
            raise ValueError(f"batch_size * (seq_len + 1) must be at most {MAX_BATCH_TOKENS}")
        if not 1 <= self.total_steps <= MAX_STEPS:
            raise ValueError(f"total_steps must be in [1, {MAX_STEPS}], got {self.total_steps}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "fixed":
            if not self.weights:
                raise ValueError("mode 'fixed' needs weights, one per source")
            if not all(0 <= w < float("inf") for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be finite, non-negative and not all zero")
        elif self.weights:
            raise ValueError(f"weights are only used with mode 'fixed', not {self.mode!r}")
        if self.task:
            task_digits(self.task, self.task_digits)      # ValueError: no such task or digits
            if self.mode != "uniform" or self.sources:
                raise ValueError("a task's batches are its problems: no sources or data mode")
        elif self.task_digits:
            raise ValueError("task_digits is a task's")
        if len(set(self.sources)) != len(self.sources):
            raise ValueError(f"sources must be distinct, got {list(self.sources)}")

    def source_mask(self, names: Sequence[str]) -> list[bool]:
        """Per corpus source (names in corpus order), whether rows may come from it: every
        source when the spec picks none. ValueError names a picked source the corpus lacks."""
        if not self.sources:
            return [True] * len(names)
        unknown = [s for s in self.sources if s not in names]
        if unknown:
            raise ValueError(f"unknown source{'s' * (len(unknown) > 1)} "
                             f"{', '.join(map(repr, unknown))}: this corpus has "
                             f"{', '.join(names)}")
        return [n in self.sources for n in names]

    def check_sources(self, n_sources: int) -> None:
        if self.mode == "fixed" and len(self.weights) != n_sources:
            raise ValueError(f"{len(self.weights)} weights given for {n_sources} sources")

    def to_dict(self) -> dict:
        return {**asdict(self), "weights": list(self.weights), "sources": list(self.sources)}

    @classmethod
    def of_run(cls, config: StoredRunConfig) -> BatchSpec:
        """The data side of a stored run config (RunConfig plus its corpus_hash)."""
        return cls(seed=config.seed, batch_size=config.batch_size, seq_len=config.seq_len,
                   vocab_size=config.vocab_size,
                   total_steps=batch_steps(config) if config.room is not None else config.steps,
                   mode=config.data_mode, corpus_hash=config.corpus_hash,
                   sources=tuple(config.sources or ()), task=config.task or "",
                   task_digits=config.task_digits or 0)
