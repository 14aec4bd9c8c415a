"""Facts the pages' JavaScript shares with the server, from their one source on the server:
base.html renders them into every page as JSON (<script id="andrea-facts">), and
static/js/app/facts.js reads them there, so no module keeps a copy. `python -m
andrea.page_facts` prints them (the Node tests of the page modules read them that way)."""

from __future__ import annotations

import json
import typing

from andrea.run_config import CLIP_MODES, MIXED_DAWN_TOGGLES, OPTIMIZER_HYPER, RunConfig
from andrea.runs.info import ENDED, EXPLAINED, RunStatus
from andrea.telemetry.protocol import BUSY, STORAGE_BUDGET


def page_facts() -> dict:
    """statuses: every status a run can have, those where training has ended (no trainer is
    at the run: no time left to count) and those whose message says why the run is there;
    clip_modes: each clip_mode's words (run_config.CLIP_MODES); optimizer_defaults: RunConfig's
    defaults of the optimizer's hyperparameters (for the kernels page and the lab; a trainer
    passes its run's); protocol: the trainer socket's close code for a storage budget used up
    and the kind of refusal a page retries (telemetry/protocol.py); mixed_dawn_toggles: the
    Dawn toggles mixed precision needs on NVIDIA (the pages name them in their advice)."""
    fields = RunConfig.model_fields
    return {
        "statuses": {"all": list(typing.get_args(RunStatus)), "ended": list(ENDED),
                     "explained": list(EXPLAINED)},
        "clip_modes": CLIP_MODES,
        "optimizer_defaults": {k: fields[k].default for k in OPTIMIZER_HYPER},
        "protocol": {"storage_budget": STORAGE_BUDGET, "busy": BUSY},
        "mixed_dawn_toggles": list(MIXED_DAWN_TOGGLES),
    }


if __name__ == "__main__":
    print(json.dumps(page_facts()))
