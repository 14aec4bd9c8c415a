"""Each room worker's shard of the run's data: the batch index of (round, slot, inner step),
so no two workers of a round train on the same batch and a rerun of a round draws the same
ones. A worker's slot is its place in the room (0 .. max_workers - 1), reused after it leaves;
the index is the run's batch route's step (data/batches.py draws a batch from seed and step).
"""

from __future__ import annotations

from andrea.run_config import RunConfig


def rounds_total(config: RunConfig) -> int:
    """Outer rounds of a room run: its steps (each worker's inner steps) in rounds of H."""
    return -(-config.steps // config.room.inner_steps)


def batch_step(config: RunConfig, version: int, slot: int, step: int) -> int:
    """The run's batch index of worker slot `slot`'s inner step `step` in the round that trains
    version `version`: every (round, slot, step) its own batch, the same at every rerun."""
    room = config.room
    return (version * room.max_workers + slot) * room.inner_steps + step


def batch_steps(config: RunConfig) -> int:
    """How many batch indices a room run draws from (the BatchSpec's total_steps)."""
    room = config.room
    return rounds_total(config) * room.max_workers * room.inner_steps
