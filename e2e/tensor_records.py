"""Synthetic step records with the per-tensor fields of server/metrics.py's Record, posted through
the trainer socket as a training tab sends them (no training in a browser: fast): each tensor's
gradient norm a fixed share of the step's grad norm (so grad_norm is the root of their summed
squares), and a planted spike carried by one tensor."""

from __future__ import annotations

import json
import math
import random

import httpx
from websockets.sync.client import connect

from tests.unit.test_spikes import run as synthetic_records


def layout_names(live_server: str, run_id: str) -> list[str]:
    layout = httpx.get(f"{live_server}/api/runs/{run_id}/layout").json()
    return [p["name"] for p in layout["params"]]


def tensor_records(names: list[str], n: int = 80, spike: dict | None = None,
                   seed: int = 0) -> list[dict]:
    """n records (tests/unit/test_spikes.py's run: grad norm ~1, no clipping) with
    tensor_grad_norms, grad_nonfinite, logit_max and softmax_denom_min. `spike`: {step, tensor
    (a name), norm}: that step's grad norm is `norm`, nearly all of it in that tensor."""
    rnd = random.Random(seed)
    weights = [rnd.uniform(0.5, 1.5) for _ in names]
    unit = math.sqrt(sum(w * w for w in weights))
    out = []
    for r in synthetic_records(n=n, seed=seed):
        norms = [w * r["grad_norm"] / unit for w in weights]
        if spike and r["step"] == spike["step"]:
            k = names.index(spike["tensor"])
            rest = sum(v * v for i, v in enumerate(norms) if i != k)
            norms[k] = math.sqrt(spike["norm"] ** 2 - rest)
            r["grad_norm"] = spike["norm"]
        r.update(tensor_grad_norms=[float(f"{v:.7g}") for v in norms], grad_nonfinite=0,
                 logit_max=round(6.0 + r["step"] / 40, 4),
                 softmax_denom_min=round(40.0 - r["step"] / 8, 4))
        out.append(r)
    return out


def send(live_server: str, run: dict, records: list[dict], status: str = "finished") -> None:
    """The records over the run's trainer socket, then its status."""
    with connect(live_server.replace("http", "ws", 1) + f"/ws/runs/{run['id']}") as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"]}))
        assert json.loads(ws.recv(timeout=15))["type"] == "welcome"
        ws.send(json.dumps({"type": "metrics", "records": records}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "ack", "step": records[-1]["step"]}
        ws.send(json.dumps({"type": "status", "status": status}))
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "pong"}
