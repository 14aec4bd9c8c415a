"""The spikes route names the run's own tensors from its layout (the anatomy of a spike itself:
tests/unit/test_spike_anatomy.py)."""

from __future__ import annotations

import math
import random

from andrea.spike_anatomy import COLLAPSE_DENOM, LOGIT_FACTOR, TOP_TENSORS


def test_the_spikes_route_names_the_tensors_from_the_runs_layout(client):
    """Records with per-tensor norms and a planted spike go through the trainer socket; the
    route's spike names the run's own tensors (its layout, a 3-layer model here)."""
    made = client.post("/api/runs", json={"preset": "tiny", "n_layer": 3, "steps": 100}).json()
    names = [p["name"] for p in made["layout"]["params"]]
    rnd = random.Random(3)
    records = []
    for step in range(1, 101):
        norms = [round(0.1 * (1 + rnd.uniform(-0.2, 0.2)), 6) for _ in names]
        if step == 60:
            norms[names.index("model.layers.2.self_attn.q_proj.weight")] = 3.0
        records.append({"step": step, "loss": 4.0, "clip_scale": 1.0, "lr": 1e-3,
                        "grad_norm": math.sqrt(sum(x * x for x in norms)),
                        "tensor_grad_norms": norms, "grad_nonfinite": 0, "logit_max": 6.0,
                        "softmax_denom_min": 1.002 if step == 60 else 30.0})
    with client.websocket_connect(f"/ws/runs/{made['id']}") as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": records})
        assert ws.receive_json() == {"type": "ack", "step": 100}
    got = client.get(f"/api/runs/{made['id']}/spikes").json()
    rule = {k: got["rule"][k] for k in ("top_tensors", "collapse_denom", "logit_factor")}
    assert rule == {"top_tensors": TOP_TENSORS, "collapse_denom": COLLAPSE_DENOM,
                    "logit_factor": LOGIT_FACTOR}
    (s,) = got["spikes"]
    assert s["tensors"][0]["name"] == "model.layers.2.self_attn.q_proj.weight"
    assert s["layer"]["name"] == "layer 2"
    assert [f["flag"] for f in s["numerical"]] == ["softmax_collapse"]
