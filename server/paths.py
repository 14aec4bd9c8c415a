"""Where a run's files live in the data dir: the one place that spells the layout.

  <data_dir>/runs/<run_id>/weights.f32       the training tab's final upload (routes/runs.py)
  <data_dir>/runs/<run_id>/checkpoints/      its training checkpoints (checkpoints.py)
  <data_dir>/runs/<run_id>/room/             a room run's state and open round (room/rounds.py)

  <data_dir>/runs/<run_id>/UNSETTLED        while its row and its folder may disagree (a delete
                                             or a branch in progress: runs/sweep.py)

Deleting a run removes its whole folder.
"""

from __future__ import annotations

from pathlib import Path


def runs_dir(data_dir: Path) -> Path:
    """The folder of every run's files."""
    return data_dir / "runs"


def run_dir(data_dir: Path, run_id: str) -> Path:
    """One run's files: weights and checkpoints."""
    return runs_dir(data_dir) / run_id


def weights_path(data_dir: Path, run_id: str) -> Path:
    return run_dir(data_dir, run_id) / "weights.f32"


def checkpoints_dir(data_dir: Path, run_id: str) -> Path:
    return run_dir(data_dir, run_id) / "checkpoints"


def room_dir(data_dir: Path, run_id: str) -> Path:
    return run_dir(data_dir, run_id) / "room"


def unsettled_mark(data_dir: Path, run_id: str) -> Path:
    """There while a delete or a branch has the run's folder ahead of its row: a start finding
    it removes the folder if the run has no row (runs/sweep.py settle_run_folders)."""
    return run_dir(data_dir, run_id) / "UNSETTLED"
