"""What the API and the viewers' websocket say about a run: the stored row plus what follows
from its config (parameters, optimizer state bytes, checkpoint sections) and whether it can be
resumed now, so pages and the CLI need not work it out."""

import time
from typing import Literal

from andrea import checkpoints
from andrea.optim import checkpoint_sections, optimizer_memory
from andrea.run_config import StoredRunConfig, model_name, run_layout

# What a trainer may report, and what a run can be: made, reported, its trainer gone, or made
# and never started (`abandoned`, shown as "never started": no trainer came within
# Settings.start_grace_s of its creation: a browser without WebGPU, a page never opened, a
# closed tab). A trainer that does come later and reports `running` still takes it.
# Pages also say "no training tab" for a `running` or `paused` run whose trainer socket is
# gone (`connected` false) until Settings.trainer_grace_s marks it `interrupted`.
TrainerStatus = Literal["running", "paused", "finished", "stopped", "failed"]
RunStatus = Literal["created", TrainerStatus, "interrupted", "abandoned"]
# Where training has ended, for now (a resume or a branch may go on): no trainer is at the run,
# so its page counts no time left, and with no step recorded says that none came.
ENDED = ("finished", "stopped", "failed", "interrupted")
# The statuses whose `message` says why the run is there; the pages show it.
EXPLAINED = ("abandoned", "interrupted", "stopped", "failed")
# static/js/app/run_status.js holds these lists too (RUN_STATUSES, ENDED, EXPLAINED):
# tests/api/test_page_facts.py holds them equal.


def abandoned_message(grace_s: float) -> str:
    """Why a run is `abandoned` (never started), for a grace period of `grace_s` seconds."""
    within = (f"{grace_s / 60:g} minutes" if grace_s >= 120 and grace_s % 60 == 0
              else f"{grace_s:g} s")
    return (f"no training tab started this run within {within} of its creation (a browser "
            "without WebGPU, a run page never opened, or a tab closed before it trained)")


# A run another tab may take over from its last checkpoint (POST /api/runs/{id}/resume). A
# killed tab leaves `running` until the grace period marks it interrupted. A failed run too:
# whatever failed it (a batch refused, a GPU error, a non-finite loss), its last checkpoint is
# sound (none is taken of a non-finite step), and the user may also branch it with another lr
# (POST /api/runs with a parent). A finished one has nothing left to do.
RESUMABLE = ("interrupted", "stopped", "paused", "running", "failed")


def checkpoint_info(config: StoredRunConfig, last_step: int | None) -> dict:
    """What a trainer needs to write and read the run's checkpoints."""
    layout = run_layout(config)
    return {"sections": checkpoint_sections(layout, config.optimizer, config.precision),
            "chunk_bytes": checkpoints.CHUNK_BYTES,
            "every": config.checkpoint_every, "last_step": last_step}


def public_run(run: dict, connected: bool) -> dict:
    """`connected`: the run has a trainer socket now (Fanout.has_trainer)."""
    cfg = run["config"]
    layout = run_layout(cfg)
    memory = optimizer_memory(layout)[cfg.optimizer]
    out = {k: v for k, v in run.items() if k != "checkpoint_step"}
    last = run.get("checkpoint_step")
    return {**out, "state_bytes": memory["state_bytes"], "n_params": layout["n_params"],
            "model_name": model_name(cfg),
            "checkpoint": checkpoint_info(cfg, last),
            "connected": connected,
            "can_resume": (not connected and run["status"] in RESUMABLE and last is not None)}


def run_message(info: dict) -> dict:
    """The viewers' {"type": "run"} message of a run as public_run shows it: JSON values
    alone, its config included (the API's responses are pydantic's to serialize)."""
    return {"type": "run", "run": {**info, "config": info["config"].model_dump(mode="json")}}


def read_run(run: dict, connected: bool, grace_s: float) -> dict:
    """The run as GET /api/runs and GET /api/runs/{id} show it (public_run). One that
    sweep.expire is about to make `abandoned` (created more than `grace_s` ago, no step
    recorded, no checkpoint, no trainer: store.runs.abandon_stale's rule) reads `abandoned` already,
    with the message it will be stored with: a read never writes."""
    if (run["status"] == "created" and not connected and run["last_step"] is None
            and run["checkpoint_step"] is None and run["updated_at"] < time.time() - grace_s):
        run = {**run, "status": "abandoned", "message": abandoned_message(grace_s)}
    return public_run(run, connected)
