"""RunConfig is strict (run_config.py): a number is a JSON number, a switch a JSON boolean. A
run's config is stored as it always was and read back as a StoredRunConfig."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from andrea.run_config import RunConfig, StoredRunConfig


@pytest.mark.parametrize("bad", [{"steps": "100"}, {"steps": True}, {"steps": 100.0},
                                 {"clip": 1}, {"clip_mode": "sometimes"}, {"clip_mode": 1},
                                 {"clip_mode": None}, {"lr": "0.1"}, {"seed": False}])
def test_run_config_is_strict(client, bad):
    assert client.post("/api/runs", json={"preset": "tiny", **bad}).status_code == 422


@pytest.mark.parametrize("given", [
    {"sources": ["python-tests", "python-docs"], "lr": 1e-3, "eps": 1e-6, "n_layer": 3},
    {"room": {"inner_steps": 4, "codec": "f32"}, "steps": 8, "optimizer": "adamw_8bit"},
    {"task": "add", "precision": "mixed"}])
def test_a_new_runs_stored_config_is_as_it_was_and_reads_back_typed(client, given):
    """POST /api/runs stores what it stored when a config was a dict, byte for byte: RunConfig's
    model_dump, its sources as the server resolved them (in corpus order), and corpus_hash
    (none for a task run); the store reads it back as that StoredRunConfig, nested models
    included, and the API serves the same fields."""
    made = client.post("/api/runs", json={"preset": "tiny", **given})
    assert made.status_code == 201, made.text
    run_id = made.json()["id"]
    store = client.app.state.store
    with store.db.tx() as conn:
        raw = conn.execute(text("SELECT config FROM runs WHERE id = :id"), {"id": run_id}).scalar()
    want = RunConfig.model_validate({"preset": "tiny", **given}).model_dump()
    if want["sources"]:
        want["sources"] = ["python-docs", "python-tests"]
    want["corpus_hash"] = "" if "task" in given else client.get("/api/corpus").json()[
        "corpus_hash"]
    assert raw == json.dumps(want)
    config = store.runs.get(run_id)["config"]
    assert isinstance(config, StoredRunConfig) and config.model_dump() == json.loads(raw)
    assert (config.room is None) == ("room" not in given)
    assert config.room is None or config.room.codec == "f32"
    assert made.json()["config"] == client.get(f"/api/runs/{run_id}").json()["config"] == \
        config.model_dump(mode="json") == json.loads(raw)
