"""The model's layout over HTTP: the preset and custom layout routes, and a run's layout as every
request reads it (made once per model, left as made). The layout itself:
tests/unit/test_model_layout.py."""

import copy

from andrea.model import preset_layout
from andrea.run_config import RunConfig, run_layout


def test_layout_api(client):
    r = client.get("/api/presets")
    assert [x["name"] for x in r.json()] == ["tiny", "toy", "12m", "120m"]
    r = client.get("/api/presets/tiny/layout")
    assert r.status_code == 200 and r.json()["config"]["n_embd"] == 64
    assert client.get("/api/presets/nope/layout").status_code == 404
    r = client.post("/api/layout", json={"vocab_size": 515, "seq_len": 128, "n_layer": 3})
    assert r.status_code == 200 and r.json()["config"]["vocab_size"] == 515
    assert client.post("/api/layout", json={"n_head": 5}).status_code == 422
    assert client.post("/api/layout", json={"bogus": 1}).status_code == 422


def test_a_runs_layout_is_made_once_per_model_and_left_as_made(client):
    """run_layout is computed once per model (model_layout, cached by its preset and frozen
    ModelConfig) and shared: a run's layout read by every request (its page, its trainer's
    checks, its checkpoints) is the same object, and none of them changes it."""
    cfg = RunConfig(preset="tiny", n_layer=3)
    layout = run_layout(cfg)
    assert run_layout(RunConfig(preset="tiny", n_layer=3)) is layout
    assert run_layout(RunConfig(preset="tiny")) is preset_layout("tiny") is not layout
    assert run_layout(RunConfig(preset="toy", n_embd=64, n_layer=2, ffn_dim=192)) is not \
        preset_layout("tiny")                    # the same shape, labelled with its own preset
    made = copy.deepcopy(layout)
    run = client.post("/api/runs", json={"preset": "tiny", "n_layer": 3}).json()
    for path in ("/api/runs/{id}/layout", "/api/runs/{id}", "/api/runs",
                 "/api/runs/{id}/metrics?format=csv", "/api/runs/{id}/spikes"):
        assert client.get(path.format(id=run["id"])).status_code == 200, path
    assert client.post("/api/run_config/layout", json={"preset": "tiny", "n_layer": 3}
                       ).status_code == 200
    stored = client.app.state.store.runs.get(run["id"])["config"]
    assert run_layout(stored) is layout and layout == made
