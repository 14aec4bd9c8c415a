"""Facts the pages' JavaScript shares with the server, from their one source on the server:
base.html renders them into every page as JSON (<script id="andrea-facts">), and
static/js/app/facts.js reads them there, so no module keeps a copy. `python -m
andrea.page_facts` prints them (the Node tests of the page modules read them that way)."""

from __future__ import annotations

import typing

from andrea.run_config import CLIP_MODES, MIXED_DAWN_TOGGLES, OPTIMIZER_HYPER, RunConfig
from andrea.runs.info import ENDED, EXPLAINED, RunStatus
from andrea.telemetry.protocol import BUSY, STORAGE_BUDGET


def route_paths(routers) -> dict[str, str]:
    """Each route's path template by its name (its function's: "get_run" ->
    "/api/runs/{run_id}"), over `routers` and the routers they include."""
    out: dict[str, str] = {}
    for router in routers:
        for route in router.routes:
            included = getattr(route, "original_router", None)   # FastAPI's included router
            if included is not None:
                out.update(route_paths([included]))
            elif getattr(route, "name", None) and getattr(route, "path", None):
                if out.setdefault(route.name, route.path) != route.path:
                    raise ValueError(f"two routes are named {route.name}")
    return out


def page_facts(routers=()) -> dict:
    """statuses: every status a run can have, those where training has ended (no trainer is
    at the run: no time left to count) and those whose message says why the run is there;
    clip_modes: each clip_mode's words (run_config.CLIP_MODES); optimizer_defaults: RunConfig's
    defaults of the optimizer's hyperparameters (for the kernels page and the lab; a trainer
    passes its run's); protocol: the trainer socket's close code for a storage budget used up
    and the kind of refusal a page retries (telemetry/protocol.py); mixed_dawn_toggles: the
    Dawn toggles mixed precision needs on NVIDIA (the pages name them in their advice);
    routes: the path template of every route of `routers` by name (route_paths: the pages
    make their URLs from these, facts.js routePath)."""
    fields = RunConfig.model_fields
    return {
        "statuses": {"all": list(typing.get_args(RunStatus)), "ended": list(ENDED),
                     "explained": list(EXPLAINED)},
        "clip_modes": CLIP_MODES,
        "optimizer_defaults": {k: fields[k].default for k in OPTIMIZER_HYPER},
        "protocol": {"storage_budget": STORAGE_BUDGET, "busy": BUSY},
        "mixed_dawn_toggles": list(MIXED_DAWN_TOGGLES),
        "routes": route_paths(routers),
    }

