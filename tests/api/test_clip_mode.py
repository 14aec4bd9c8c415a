"""clip_mode (global, per_tensor, off) replaced the `clip` switch: a new run takes either, an
older client's `clip: true/false` and a run stored before clip_mode read as global/off, both at
once is refused."""

from __future__ import annotations

import json

import pytest

from andrea.run_config import RunConfig
from andrea.store import Store
from andrea.write_tokens import token_hash
from tests.trainer_client import store_old_config


@pytest.mark.parametrize("given,mode", [
    ({}, "global"), ({"clip_mode": "per_tensor"}, "per_tensor"), ({"clip_mode": "off"}, "off"),
    ({"clip": True}, "global"), ({"clip": False}, "off"),    # an older client's switch
])
def test_a_run_is_stored_and_served_with_its_clip_mode(client, given, mode):
    made = client.post("/api/runs", json={"preset": "tiny", **given})
    assert made.status_code == 201, made.text
    for config in (made.json()["config"], client.get(f"/api/runs/{made.json()['id']}").json()[
            "config"]):
        assert config["clip_mode"] == mode and "clip" not in config


@pytest.mark.parametrize("both", [{"clip": True, "clip_mode": "global"},
                                  {"clip": False, "clip_mode": "per_tensor"}])
def test_clip_and_clip_mode_together_are_422(client, both):
    r = client.post("/api/runs", json={"preset": "tiny", **both})
    assert r.status_code == 422 and "not both" in json.dumps(r.json()["detail"])


@pytest.mark.parametrize("bad", [{"clip": 1}, {"clip": "true"}, {"clip": None},
                                 {"clip_mode": "sometimes"}, {"clip_mode": True}])
def test_a_clip_of_the_wrong_type_is_422(client, bad):
    assert client.post("/api/runs", json={"preset": "tiny", **bad}).status_code == 422


@pytest.mark.parametrize("clip,mode", [(True, "global"), (False, "off")])
def test_a_run_stored_before_clip_mode_reads_back_with_it(client, clip, mode):
    """A config row as the server wrote it before clip_mode (with `clip`), read through the
    store and the API: clip_mode, and no `clip`."""
    old = {**client.post("/api/runs", json={"preset": "tiny"}).json()["config"], "clip": clip}
    del old["clip_mode"]
    store = client.app.state.store
    store_old_config(store, "old1", old, token_hash("t"))
    want = {**{k: v for k, v in old.items() if k != "clip"}, "clip_mode": mode}
    assert store.runs.get("old1")["config"].model_dump(mode="json") == want
    for config in (store.runs.get("old1")["config"].model_dump(),
                   client.get("/api/runs/old1").json()["config"]):
        assert config["clip_mode"] == mode and "clip" not in config
    listed = next(r for r in client.get("/api/runs").json() if r["id"] == "old1")
    assert listed["config"]["clip_mode"] == mode


def test_a_run_stored_before_clip_mode_in_a_database_file(tmp_path):
    """The same from the SQLite file itself: the row's JSON keeps `clip`, the read maps it."""
    import sqlite3

    store = Store(tmp_path / "andrea.sqlite")
    store_old_config(store, "r1", {"preset": "tiny", "optimizer": "adamw", "clip": False,
                                   "max_norm": 1.0, "seq_len": 64, "warmup_steps": 20,
                                   "corpus_hash": ""}, token_hash("t"))
    (raw,) = sqlite3.connect(tmp_path / "andrea.sqlite").execute(
        "SELECT config FROM runs WHERE id = 'r1'").fetchone()
    assert json.loads(raw)["clip"] is False
    config = store.runs.get("r1")["config"]
    assert config.clip_mode == "off" and "clip" not in config.model_dump()


def test_the_validated_config_carries_no_clip():
    assert "clip" not in RunConfig.model_validate({"preset": "tiny", "clip": False}).model_dump()
