"""What the API and the viewers' websocket say about a run: the stored row plus the sizes that
follow from its config (parameters, optimizer state bytes)."""

from typing import Literal

from andrea.model import PRESETS, build_layout
from andrea.optim import optimizer_memory

# What a trainer may report, and what a run can be: made, reported, or its trainer gone.
TrainerStatus = Literal["running", "paused", "finished", "stopped", "failed"]
RunStatus = Literal["created", TrainerStatus, "interrupted"]


def public_run(run: dict) -> dict:
    cfg = run["config"]
    layout = build_layout(PRESETS[cfg["preset"]])
    memory = optimizer_memory(layout)[cfg["optimizer"]]
    return {**run, "state_bytes": memory["state_bytes"], "n_params": layout["n_params"]}
