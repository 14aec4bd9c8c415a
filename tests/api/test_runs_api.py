import contextlib
import time

import pytest

from andrea.metrics import COLUMNS
from andrea.telemetry import MAX_MESSAGE_BYTES, RECORDS_PER_MESSAGE


@contextlib.contextmanager
def trains(client, run):
    """A trainer socket that said hello and `running`, committed (its pong came back)."""
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "status", "status": "running"})
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}
        yield ws


def test_minimal_config_gets_defaults(client):
    r = client.post("/api/runs", json={"preset": "tiny"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["config"]["optimizer"] == "adamw" and body["config"]["seq_len"] == 64
    assert body["config"]["clip_mode"] == "global" and body["config"]["max_norm"] == 1.0
    assert "clip" not in body["config"]
    assert len(body["token"]) >= 24 and body["layout"]["config"]["n_embd"] == 64
    rid = body["id"]
    assert body["data"]["batches"] == f"/api/runs/{rid}/batches/{{step}}"
    assert body["data"]["val_batches"] == f"/api/runs/{rid}/val_batches/{{index}}"
    # The 8-bit default keeps the embedding's (the tied head's) state in 32-bit, as bitsandbytes
    # users do (server/optim.py; tests/unit/test_optim_maps.py checks the all-8-bit bound of 0.3x).
    q8, fp32 = body["optimizer_state"]["adamw_8bit"], body["optimizer_state"]["adamw"]
    assert q8["policy"] == "embed_f32" and "model.embed_tokens.weight" in q8["f32_tensors"]
    assert q8["state_bytes"] < 0.5 * fp32["state_bytes"]
    run = client.get(f"/api/runs/{body['id']}").json()
    assert run["status"] == "created" and "token" not in run and "token_sha256" not in run
    assert [x["id"] for x in client.get("/api/runs").json()] == [body["id"]]


@pytest.mark.parametrize("bad", [
    {}, {"preset": "huge"}, {"preset": "tiny", "optimizer": "sgd"},
    {"preset": "tiny", "lr": -1}, {"preset": "tiny", "steps": "many"},
    {"preset": "tiny", "seq_len": 8193}, {"preset": "tiny", "bogus": 1},
    {"preset": "tiny", "n_head": 5}, {"preset": "tiny", "n_embd": 1024, "n_head": 2},
    {"preset": "tiny", "vocab_size": 1000}, {"preset": "tiny", "n_layer": 0},
    {"preset": "tiny", "n_embd": 66, "n_head": 6},
    {"preset": "tiny", "warmup_steps": 500, "steps": 100},
])
def test_bad_configs_are_422(client, bad):
    r = client.post("/api/runs", json=bad)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_a_run_may_give_its_own_shape(client):
    """Shape fields override the preset's; the layout, names, memory and the run's own layout
    endpoint all follow the run's shape, and a stored run has every shape field filled in."""
    shape = {"n_layer": 3, "n_embd": 96, "n_head": 3, "ffn_dim": 160, "vocab_size": 1024,
             "seq_len": 128}
    r = client.post("/api/runs", json={"preset": "tiny", **shape})
    assert r.status_code == 201, r.text
    body = r.json()
    layout = body["layout"]
    assert {k: layout["config"][k] for k in shape} == shape and layout["config"]["head_dim"] == 32
    assert sum(p["name"].endswith("q_proj.weight") for p in layout["params"]) == 3
    emb = next(p for p in layout["params"] if p["name"] == "model.embed_tokens.weight")
    assert emb["shape"] == [1024, 96] and body["data"]["tokenizer"] == "/api/tokenizer/1024"
    assert body["data"]["spec"]["vocab_size"] == 1024 and body["data"]["spec"]["seq_len"] == 128
    run = client.get(f"/api/runs/{body['id']}").json()
    assert run["model_name"] == "tiny L3 C96 H3 F160 V1024 T128"
    assert run["name"].startswith("tiny L3 C96 H3 F160 V1024 T128 adamw")
    assert run["n_params"] == layout["n_params"]
    assert client.get(f"/api/runs/{body['id']}/layout").json()["params"] == layout["params"]
    # The form's estimate: the same table for the same config, before any run exists.
    est = client.post("/api/run_config/layout", json={"preset": "tiny", **shape}).json()
    assert est["params"] == layout["params"] and est["optimizer_state"] == body["optimizer_state"]
    # Left out, every shape field is the preset's, and stored explicitly.
    plain = client.post("/api/runs", json={"preset": "tiny"}).json()
    assert {k: plain["config"][k] for k in ("n_layer", "n_embd", "n_head", "ffn_dim",
                                             "vocab_size")} == {
        "n_layer": 2, "n_embd": 64, "n_head": 4, "ffn_dim": 192, "vocab_size": 512}
    assert client.get(f"/api/runs/{plain['id']}").json()["model_name"] == "tiny"


def test_a_refused_shape_says_why(client):
    r = client.post("/api/run_config/layout", json={"preset": "tiny", "n_head": 5})
    assert r.status_code == 422 and "divisible by n_head" in r.text
    r = client.post("/api/run_config/layout", json={"preset": "tiny", "n_embd": 512, "n_head": 2})
    assert r.status_code == 422 and "head_dim (256)" in r.text


def test_empty_warmup_is_the_server_default(client):
    """The new-run form leaves warmup out when it is empty: a short run must not be refused
    for a warmup nobody asked for."""
    r = client.post("/api/runs", json={"preset": "tiny", "steps": 5})
    assert r.status_code == 201, r.text
    assert r.json()["config"]["warmup_steps"] == 0
    assert client.get("/api/run_config").json()["properties"]["warmup_steps"]["default"] is None


def test_nan_in_config_is_rejected(client):
    r = client.post("/api/runs", content=b'{"preset": "tiny", "lr": NaN}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_unknown_run_is_404(client):
    assert client.get("/api/runs/nope").status_code == 404
    assert client.get("/api/runs/nope/metrics").status_code == 404
    assert client.get("/api/runs/nope/batches/0").status_code == 404


def test_run_batches_are_served(client):
    run = client.post("/api/runs", json={"preset": "tiny", "batch_size": 2, "steps": 5}).json()
    r = client.get(f"/api/runs/{run['id']}/batches/0")
    assert r.status_code == 200 and r.content[:4] == b"ANDB"
    assert client.get(f"/api/runs/{run['id']}/batches/5").status_code == 400  # past the end


def test_server_restart_keeps_runs_metrics_and_batches(settings):
    from fastapi.testclient import TestClient

    from andrea.app import create_app

    with TestClient(create_app(settings)) as c1:
        run = c1.post("/api/runs", json={"preset": "tiny", "batch_size": 2, "steps": 5}).json()
        batch = c1.get(f"/api/runs/{run['id']}/batches/3").content
        with c1.websocket_connect(f"/ws/runs/{run['id']}") as ws:
            ws.send_json({"type": "hello", "token": run["token"]})
            assert ws.receive_json()["type"] == "welcome"
            ws.send_json({"type": "metrics", "records": [
                {"step": 1, "loss": 6.0, "grad_norm": 2.0, "clip_scale": 0.5, "lr": 1e-3}]})
            assert ws.receive_json() == {"type": "ack", "step": 1}
    with TestClient(create_app(settings)) as c2:   # a new process on the same data dir
        assert c2.get(f"/api/runs/{run['id']}").json()["status"] == "created"
        assert [m["step"] for m in c2.get(f"/api/runs/{run['id']}/metrics").json()] == [1]
        assert c2.get(f"/api/runs/{run['id']}/batches/3").content == batch
        with c2.websocket_connect(f"/ws/runs/{run['id']}") as ws:
            ws.send_json({"type": "hello", "token": run["token"], "last_acked_step": 0})
            assert ws.receive_json() == {"type": "welcome", "last_committed_step": 1,
                                         "records_per_message": RECORDS_PER_MESSAGE,
                                         "max_message_bytes": MAX_MESSAGE_BYTES}


def test_telemetry_source_losses_steer_the_bandit(client):
    """Per-source losses sent over the websocket reach the run's bandit: a source whose loss
    improves gets more weight in a later phase."""
    run = client.post("/api/runs", json={"preset": "tiny", "batch_size": 4, "steps": 400,
                                          "data_mode": "bandit"}).json()
    rid = run["id"]
    client.get(f"/api/runs/{rid}/batches/0")
    with client.websocket_connect(f"/ws/runs/{rid}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        ws.receive_json()
        step = 0
        for phase in range(3):
            client.get(f"/api/runs/{rid}/batches/{step}")     # decides this phase's weights
            info = client.get(f"/api/runs/{rid}/data").json()["phases"][-1]
            end = info["start"] + info["length"]
            records = [{"step": s + 1, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
                        "source_losses": {"0": 6.0 - 0.5 * phase, "1": 6.0}}
                       for s in range(step, end)]
            ws.send_json({"type": "metrics", "records": records})
            assert ws.receive_json()["type"] == "ack"
            step = end
        client.get(f"/api/runs/{rid}/batches/{step}")
    weights = client.get(f"/api/runs/{rid}/data").json()["phases"][-1]["weights"]
    assert weights[0] > weights[1], weights


@pytest.mark.parametrize("key", ["7", "x"])
def test_telemetry_losses_of_unknown_sources_are_refused(client, key):
    run = client.post("/api/runs", json={"preset": "tiny", "data_mode": "bandit"}).json()
    client.get(f"/api/runs/{run['id']}/batches/0")      # the bandit exists
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        ws.receive_json()
        ws.send_json({"type": "metrics", "records": [
            {"step": 1, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
             "source_losses": {"0": 5.0, key: 5.0}}]})
        error = ws.receive_json()     # before anything is committed: no ack
        assert error["type"] == "error" and "source" in error["message"], error


@pytest.mark.parametrize("made", [False, True])
@pytest.mark.parametrize("which", ["far", "past the last", "not picked"])
def test_losses_of_sources_the_run_lacks_are_refused_before_anything_is_stored(client, which,
                                                                               made):
    """The run picked sources 0 and 2 of the corpus (3 on Debian's python3, 4 on python.org's):
    "99", the index one past the corpus's last source and "1" name none of its sources. The
    message is refused (1003) with nothing committed, whether the run's bandit exists yet or
    not, and the run goes on serving batches."""
    from starlette.websockets import WebSocketDisconnect

    names = [s["name"] for s in client.get("/api/corpus?preset=tiny").json()["sources"]]
    assert len(names) >= 3, names
    key = {"far": "99", "past the last": str(len(names)), "not picked": "1"}[which]
    run = client.post("/api/runs", json={"preset": "tiny", "data_mode": "bandit",
                                         "sources": [names[0], names[2]]}).json()
    rid = run["id"]
    if made:
        assert client.get(f"/api/runs/{rid}/batches/0").status_code == 200
    good = {"step": 1, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}
    with client.websocket_connect(f"/ws/runs/{rid}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        ws.receive_json()
        ws.send_json({"type": "metrics", "records": [
            good, {**good, "step": 2, "source_losses": {"0": 5.0, key: 5.0}}]})
        error = ws.receive_json()
        assert error["type"] == "error" and repr(key) in error["message"], error
        assert "0 (" in error["message"] and "2 (" in error["message"], error
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1003
    assert client.get(f"/api/runs/{rid}/metrics").json() == []
    client.app.state.runs.forget(rid)       # as after a restart: the bandit replays the store
    assert client.get(f"/api/runs/{rid}/batches/0").status_code == 200
    assert client.get(f"/api/runs/{rid}/data").status_code == 200


def test_a_stored_unknown_source_is_skipped_by_the_replay_and_the_run_heals(settings, caplog):
    """A record committed before the socket checked source indices ("99" of 3 sources): after a
    restart the bandit replays the rest of it and says what it skipped."""
    import logging

    from fastapi.testclient import TestClient

    from andrea.app import create_app

    with TestClient(create_app(settings)) as c:
        run = c.post("/api/runs", json={"preset": "tiny", "data_mode": "bandit"}).json()
        c.app.state.store.metrics.add(run["id"], [
            {"step": s, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
             "source_losses": {"0": 5.0, "99": 4.0}} for s in range(1, 30)])
    with caplog.at_level(logging.WARNING, logger="andrea.data"), \
            TestClient(create_app(settings)) as c:
        r = c.get(f"/api/runs/{run['id']}/batches/28")
        assert r.status_code == 200, r.text
        data = c.get(f"/api/runs/{run['id']}/data")
        assert data.status_code == 200, data.text
        assert data.json()["phases"][0]["index"] == 0
    said = [r.getMessage() for r in caplog.records if run["id"] in r.getMessage()]
    assert len(said) == 1 and "'99'" in said[0] and "29 stored source losses" in said[0], said


def test_run_whose_trainer_vanishes_is_marked_interrupted(tmp_path):
    import time

    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings

    app = create_app(Settings(data_dir=tmp_path, trainer_grace_s=0.3))
    with TestClient(app) as c:
        run = c.post("/api/runs", json={"preset": "tiny"}).json()
        with trains(c, run):
            pass
        deadline = time.monotonic() + 10
        while c.get(f"/api/runs/{run['id']}").json()["status"] == "running":
            assert time.monotonic() < deadline, "never marked interrupted"
            time.sleep(0.1)
        info = c.get(f"/api/runs/{run['id']}").json()
        assert info["status"] == "interrupted" and "went away" in info["message"]


def status_becomes(client, run_id: str, want: str, within_s: float = 10.0) -> dict:
    import time

    deadline = time.monotonic() + within_s
    while (info := client.get(f"/api/runs/{run_id}").json())["status"] != want:
        assert time.monotonic() < deadline, f"never {want}: {info['status']} {info['message']}"
        time.sleep(0.05)
    return info


def test_a_tab_that_drops_twice_is_judged_by_its_latest_drop(tmp_path):
    """The first drop's watchdog fires while the tab is away again, but only briefly: the run
    stays running (it was marked interrupted, counted from the first drop); the second drop's
    watchdog marks it, and the tab, back, reports its status again and flips it back."""
    import time

    from andrea.app import create_app
    from andrea.config import Settings
    from tests.conftest import LocalClient

    grace = 2.0
    with LocalClient(create_app(Settings(data_dir=tmp_path, trainer_grace_s=grace))) as c:
        run = c.post("/api/runs", json={"preset": "tiny"}).json()
        with trains(c, run):
            pass
        first_drop = time.monotonic()
        with trains(c, run):
            time.sleep(grace / 2)
        time.sleep(max(0.0, first_drop + grace + 0.4 - time.monotonic()))
        assert c.get(f"/api/runs/{run['id']}").json()["status"] == "running"
        assert "went away" in status_becomes(c, run["id"], "interrupted")["message"]
        with trains(c, run):        # (trains says `running`, as the page does after a welcome)
            assert c.get(f"/api/runs/{run['id']}").json()["status"] == "running"


def test_runs_whose_tabs_left_before_a_restart_are_interrupted_after_it(tmp_path):
    """A restart took the watchdogs down: the new process arms them again for every run a tab
    should be at: a running run whose tab is gone, and a resumed run whose tab never came; a
    room run (trained by its workers, no trainer socket) is left alone."""
    from andrea.app import create_app
    from andrea.config import Settings
    from tests.api.test_checkpoints import put, state
    from tests.api.test_room import room_config
    from tests.conftest import LocalClient

    with LocalClient(create_app(Settings(data_dir=tmp_path))) as c:     # a 60 s grace
        left = c.post("/api/runs", json={"preset": "tiny"}).json()
        with trains(c, left):
            pass
        resumed = c.post("/api/runs", json={"preset": "tiny", "steps": 200}).json()
        with trains(c, resumed):
            pass
        assert put(c, resumed, 2, state(resumed)).status_code == 201
        c.app.state.store.metrics.add(resumed["id"], [
            {"step": s, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}
            for s in (1, 2)])
        assert c.post(f"/api/runs/{resumed['id']}/resume").status_code == 200
        room = c.post("/api/runs", json=room_config()).json()
    with LocalClient(create_app(Settings(data_dir=tmp_path, trainer_grace_s=0.3))) as c:
        assert "went away" in status_becomes(c, left["id"], "interrupted")["message"]
        info = status_becomes(c, resumed["id"], "interrupted")
        assert "resumed" in info["message"] and info["can_resume"]
        assert c.get(f"/api/runs/{room['id']}").json()["status"] == "running"


def test_a_resumed_tab_that_closes_before_its_first_step_leaves_it_resumable(tmp_path):
    """The page opens its socket before it loads the checkpoint and compiles: closed then, the
    run is still `created` from its checkpoint, and becomes interrupted (it stayed created)."""
    from andrea.app import create_app
    from andrea.config import Settings
    from tests.api.test_checkpoints import put, state, train_some
    from tests.conftest import LocalClient

    with LocalClient(create_app(Settings(data_dir=tmp_path, trainer_grace_s=0.3))) as c:
        run = c.post("/api/runs", json={"preset": "tiny", "steps": 200}).json()
        train_some(c, run, 2, "paused")
        assert put(c, run, 2, state(run)).status_code == 201
        token = c.post(f"/api/runs/{run['id']}/resume").json()["token"]
        with c.websocket_connect(f"/ws/runs/{run['id']}") as ws:    # the resuming tab
            ws.send_json({"type": "hello", "token": token})
            assert ws.receive_json()["type"] == "welcome"
            ws.send_json({"type": "ping"})
            assert ws.receive_json() == {"type": "pong"}
            time.sleep(0.6)         # past the resume's own watchdog: it saw this trainer
        status_becomes(c, run["id"], "interrupted")
        assert c.post(f"/api/runs/{run['id']}/resume").status_code == 200


def test_a_hello_refused_on_a_room_run_leaves_it_running(tmp_path):
    """A room run has no trainer socket: a hello with its token is refused before it counts as
    one, so no watchdog marks the room interrupted when that socket goes."""
    from andrea.app import create_app
    from andrea.config import Settings
    from tests.api.test_room import room_config
    from tests.conftest import LocalClient

    with LocalClient(create_app(Settings(data_dir=tmp_path, trainer_grace_s=0.2))) as c:
        room = c.post("/api/runs", json=room_config()).json()
        with c.websocket_connect(f"/ws/runs/{room['id']}") as ws:
            ws.send_json({"type": "hello", "token": room["token"]})
            msg = ws.receive_json()
            assert msg["type"] == "error" and "room run" in msg["message"]
        time.sleep(0.6)
        assert c.get(f"/api/runs/{room['id']}").json()["status"] == "running"


def test_a_run_no_trainer_takes_is_never_started_after_the_grace_and_its_viewers_hear(
        tmp_path):
    """Settings.start_grace_s (ANDREA_START_GRACE_S): past it, a run no trainer took is
    `abandoned` (pages: "never started") without anyone listing runs, and a viewer watching it
    is told; a run whose trainer is connected is left alone."""

    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings

    # 2 s: room for a loaded machine between a run's creation and its trainer's hello.
    with TestClient(create_app(Settings(data_dir=tmp_path, start_grace_s=2))) as c:
        lone = c.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
        held = c.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
        with c.websocket_connect(f"/ws/runs/{held['id']}") as trainer, \
                c.websocket_connect(f"/ws/runs/{lone['id']}/watch") as viewer:
            trainer.send_json({"type": "hello", "token": held["token"]})
            assert trainer.receive_json()["type"] == "welcome"
            first = viewer.receive_json()
            assert first["type"] == "run" and first["run"]["status"] == "created"
            assert first["run"]["connected"] is False
            told = viewer.receive_json()        # the grace passes: no request needed
            assert told["type"] == "run" and told["run"]["status"] == "abandoned"
            assert "within 2 s" in told["run"]["message"]
            info = c.get(f"/api/runs/{held['id']}").json()
            assert info["status"] == "created" and info["connected"] is True
        # A tab that does come later still takes it.
        with trains(c, lone):
            info = c.get(f"/api/runs/{lone['id']}").json()
            assert info["status"] == "running" and info["connected"] is True


def test_start_grace_comes_from_the_environment(monkeypatch, tmp_path):
    from andrea.config import Settings

    monkeypatch.setenv("ANDREA_START_GRACE_S", "7.5")
    assert Settings(data_dir=tmp_path).start_grace_s == 7.5


def test_a_running_run_says_whether_its_trainer_is_connected(tmp_path):
    """`connected` in the run JSON (list, read, viewers): a running run whose tab went away
    reads "no training tab" on the pages, and its viewers are told when it goes and when a
    tab comes back (a dropped connection)."""
    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings

    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        run = c.post("/api/runs", json={"preset": "tiny", "steps": 50}).json()
        rid = run["id"]
        with c.websocket_connect(f"/ws/runs/{rid}/watch") as viewer:
            assert viewer.receive_json()["type"] == "run"
            with c.websocket_connect(f"/ws/runs/{rid}") as ws:
                ws.send_json({"type": "hello", "token": run["token"]})
                assert ws.receive_json()["type"] == "welcome"
                ws.send_json({"type": "status", "status": "running"})
                msg = viewer.receive_json()
                assert msg["run"]["status"] == "running" and msg["run"]["connected"] is True
                assert c.get(f"/api/runs/{rid}").json()["connected"] is True
                assert {r["id"]: r["connected"] for r in c.get("/api/runs").json()}[rid]
            # The tab went away: (an update of while it was there may come first: the hello's
            # and the status's each publish one)
            for _ in range(3):
                if (msg := viewer.receive_json())["run"]["connected"] is False:
                    break
            assert msg["run"]["status"] == "running" and msg["run"]["connected"] is False
            assert c.get(f"/api/runs/{rid}").json()["connected"] is False
            with c.websocket_connect(f"/ws/runs/{rid}") as ws:     # and came back
                ws.send_json({"type": "hello", "token": run["token"]})
                assert ws.receive_json()["type"] == "welcome"
                msg = viewer.receive_json()
                assert msg["run"]["status"] == "running" and msg["run"]["connected"] is True


def test_model_download_is_the_uploaded_weights_byte_for_byte_every_time(client):
    """The same weights give the same file: a download equals any other download or CLI export
    (safetensors orders multi-key metadata at random, so the header must hold one key)."""
    import numpy as np
    from safetensors.numpy import load

    run = client.post("/api/runs", json={"preset": "tiny"}).json()
    w = np.random.default_rng(0).standard_normal(run["layout"]["total_numel"]).astype("<f4")
    r = client.put(f"/api/runs/{run['id']}/weights", content=w.tobytes(),
                   headers={"authorization": f"Bearer {run['token']}"})
    assert r.status_code == 204, r.text
    bodies = {client.get(f"/api/runs/{run['id']}/model.safetensors").content for _ in range(8)}
    assert len(bodies) == 1
    tensors = load(bodies.pop())
    for p in run["layout"]["params"]:
        want = w[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"])
        assert np.array_equal(tensors[p["name"]], want), p["name"]


def test_optimizer_time_is_stored_and_exported(client):
    """opt_ms (the optimizer phase's GPU time) goes through the websocket into SQLite and comes
    back in the JSON metrics and the CSV export; a record without it stays without it."""
    run = client.post("/api/runs", json={"preset": "tiny"}).json()
    base = {"loss": 6.0, "grad_norm": 2.0, "clip_scale": 0.5, "lr": 1e-3}
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": [{"step": 1, **base, "opt_ms": 0.25},
                                                     {"step": 2, **base}]})
        assert ws.receive_json() == {"type": "ack", "step": 2}
    rows = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert rows[0]["opt_ms"] == 0.25 and "opt_ms" not in rows[1]
    csv_lines = client.get(f"/api/runs/{run['id']}/metrics?format=csv").text.splitlines()
    header, first = csv_lines[0].split(","), csv_lines[1].split(",")
    assert header[:len(COLUMNS)] == list(COLUMNS)      # the record's numbers, in its order
    assert first[header.index("opt_ms")] == "0.25"


def test_a_store_from_before_a_metric_existed_gains_its_column(tmp_path):
    """A database written when opt_ms lived in the JSON column opens with an opt_ms column,
    and old and new rows read back the same way."""
    import json
    import sqlite3

    from andrea.store import Store

    path = tmp_path / "andrea.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE metrics (run_id TEXT NOT NULL, step INTEGER NOT NULL, loss REAL,
          grad_norm REAL, clip_scale REAL, lr REAL, tokens_per_s REAL, step_ms REAL,
          eval_loss REAL, extra TEXT, PRIMARY KEY (run_id, step)) WITHOUT ROWID;""")
    db.execute("INSERT INTO metrics (run_id, step, loss, grad_norm, clip_scale, lr, extra)"
               " VALUES ('r', 1, 5.0, 1.0, 1.0, 0.001, ?)", (json.dumps({"opt_ms": 0.5}),))
    db.commit()
    db.close()
    store = Store(path)
    store.metrics.add("r", [{"step": 2, "loss": None, "grad_norm": 1.0, "clip_scale": 1.0,
                             "lr": 0.001, "opt_ms": 0.25}])
    rows = store.metrics.all("r")
    assert [(r["step"], r["loss"], r["opt_ms"]) for r in rows] == [(1, 5.0, 0.5), (2, None, 0.25)]
    assert "eval_loss" not in rows[1]
    columns = {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(metrics)")}
    assert set(COLUMNS) <= columns


# ---- the dashboard: names, tags, notes, delete, commit times, abandoned runs ----------------
def _send(client, run, records):
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": records})
        assert ws.receive_json()["type"] == "ack"


def test_runs_get_readable_names_and_can_be_renamed_tagged_and_noted(client):
    first = client.post("/api/runs", json={"preset": "tiny"}).json()
    second = client.post("/api/runs", json={"preset": "tiny", "optimizer": "adamw_8bit"}).json()
    names = {r["id"]: r["name"] for r in client.get("/api/runs").json()}
    assert names == {first["id"]: "tiny adamw #1", second["id"]: "tiny adamw_8bit #2"}
    r = client.patch(f"/api/runs/{first['id']}",
                     json={"name": "  baseline ", "tags": ["fp32", "fp32", "lr 3e-3"],
                           "notes": "the reference"})
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["tags"], r.json()["notes"]) == \
        ("baseline", ["fp32", "lr 3e-3"], "the reference")
    got = client.get(f"/api/runs/{first['id']}").json()
    assert (got["name"], got["tags"], got["notes"]) == ("baseline", ["fp32", "lr 3e-3"],
                                                        "the reference")
    # Fields left out stay; no token is needed (the write token lives in the training tab).
    assert client.patch(f"/api/runs/{first['id']}", json={"notes": "x"}).json()["name"] == \
        "baseline"
    for bad in ({"name": ""}, {"name": "   "}, {"tags": "fp32"}, {"bogus": 1},
                {"name": "x" * 121}):
        assert client.patch(f"/api/runs/{first['id']}", json=bad).status_code == 422, bad
    assert client.patch("/api/runs/nope", json={"name": "x"}).status_code == 404


def test_delete_removes_the_run_its_metrics_events_and_files(client, settings):
    run = client.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
    keep = client.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
    rec = {"loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}
    _send(client, run, [{"step": 1, **rec}])
    _send(client, keep, [{"step": 1, **rec}])
    folder = settings.data_dir / "runs" / run["id"]
    w = b"\0" * (4 * run["layout"]["total_numel"])
    assert client.put(f"/api/runs/{run['id']}/weights", content=w,
                      headers={"authorization": f"Bearer {run['token']}"}).status_code == 204
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    assert folder.exists()
    # While a trainer is connected the run cannot be deleted.
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        assert ws.receive_json()["type"] == "welcome"
        r = client.delete(f"/api/runs/{run['id']}")
        assert r.status_code == 409 and "training" in r.json()["detail"]
    assert client.delete(f"/api/runs/{run['id']}").status_code == 204
    assert client.get(f"/api/runs/{run['id']}").status_code == 404
    assert client.get(f"/api/runs/{run['id']}/metrics").status_code == 404
    assert [r["id"] for r in client.get("/api/runs").json()] == [keep["id"]]
    assert not folder.exists()
    assert client.delete(f"/api/runs/{run['id']}").status_code == 404
    import sqlite3
    db = sqlite3.connect(settings.db_path)
    for table in ("metrics", "events", "revoked_tokens", "runs"):
        col = "id" if table == "runs" else "run_id"
        assert db.execute(f"SELECT COUNT(*) FROM {table} WHERE {col} = ?",
                          (run["id"],)).fetchone()[0] == 0, table
    assert [m["step"] for m in client.get(f"/api/runs/{keep['id']}/metrics").json()] == [1]


def test_each_metrics_row_has_its_commit_time(client):
    import time
    run = client.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
    before = time.time()
    _send(client, run, [{"step": s, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0,
                         "lr": 3e-4} for s in (1, 2)])
    rows = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert all(before - 1 <= r["time"] <= time.time() + 1 for r in rows), rows
    lines = client.get(f"/api/runs/{run['id']}/metrics?format=csv").text.splitlines()
    header = lines[0].split(",")
    assert "time" in header
    assert float(lines[1].split(",")[header.index("time")]) == rows[0]["time"]
    info = client.get(f"/api/runs/{run['id']}").json()
    assert info["first_time"] == rows[0]["time"] and info["last_time"] == rows[1]["time"]
    # A trainer cannot set the time itself.
    with client.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        ws.receive_json()
        ws.send_json({"type": "metrics", "records": [{"step": 3, "loss": 5.0, "grad_norm": 1.0,
                                                      "clip_scale": 1.0, "lr": 3e-4,
                                                      "time": 0.0}]})
        assert ws.receive_json()["type"] == "error"


def test_a_run_no_trainer_ever_started_becomes_abandoned_and_can_still_train(client, settings):
    import sqlite3
    import time

    grace = settings.start_grace_s
    assert grace == 90          # the default: "never started" after a minute and a half
    stale = client.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
    fresh = client.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
    db = sqlite3.connect(settings.db_path)
    db.execute("UPDATE runs SET created_at = ?, updated_at = ? WHERE id = ?",
               (time.time() - grace - 5, time.time() - grace - 5, stale["id"]))
    db.commit()
    status = {r["id"]: r["status"] for r in client.get("/api/runs").json()}
    assert status == {stale["id"]: "abandoned", fresh["id"]: "created"}
    info = client.get(f"/api/runs/{stale['id']}").json()
    assert info["status"] == "abandoned" and "within 90 s" in info["message"]
    assert info["connected"] is False and info["can_resume"] is False
    # A tab that does come later still trains it.
    with trains(client, stale):
        pass
    assert client.get(f"/api/runs/{stale['id']}").json()["status"] in ("running", "interrupted")


def test_reading_runs_never_writes_and_the_sweep_stores_what_reads_show(tmp_path, monkeypatch):
    """GET /api/runs and GET /api/runs/{id} run no write: a run past its start grace reads
    "never started" before anything stored it. The app's sweep stores it: at startup (runs
    left from before a restart), then every EXPIRE_EVERY_S, telling its viewers."""
    import sqlite3
    import time

    from fastapi.testclient import TestClient
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from andrea.app import create_app
    from andrea.config import Settings
    from andrea.runs import sweep as run_sweep

    settings = Settings(data_dir=tmp_path / "data")

    def backdate(*run_ids):
        with sqlite3.connect(settings.db_path) as db:
            for run_id in run_ids:
                db.execute("UPDATE runs SET created_at = ?, updated_at = ? WHERE id = ?",
                           (time.time() - 100, time.time() - 100, run_id))

    def stored(run_id):
        with sqlite3.connect(settings.db_path) as db:
            return db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]

    monkeypatch.setattr(run_sweep, "EXPIRE_EVERY_S", 3600)     # no sweep meanwhile
    with TestClient(create_app(settings)) as c:
        stale, fresh, trained = (c.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
                                 for _ in range(3))
        _send(c, trained, [{"step": 1, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0,
                            "lr": 3e-4}])                   # a step recorded: it started
        backdate(stale["id"], trained["id"])
        seen = []

        def statement(conn, cursor, sql, params, context, executemany):
            seen.append(sql)
        event.listen(Engine, "before_cursor_execute", statement)
        try:
            listed = {r["id"]: r for r in c.get("/api/runs").json()}
            one = c.get(f"/api/runs/{stale['id']}").json()
        finally:
            event.remove(Engine, "before_cursor_execute", statement)
        writes = [sql for sql in seen
                  if sql.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "BEGIN")]
        assert seen and writes == [], writes
        assert {k: r["status"] for k, r in listed.items()} == {
            stale["id"]: "abandoned", fresh["id"]: "created", trained["id"]: "created"}
        assert one["status"] == "abandoned" and "within 90 s" in one["message"]
        assert listed[stale["id"]]["message"] == one["message"]
        assert stored(stale["id"]) == "created"             # shown, not stored
    with TestClient(create_app(settings)) as c:             # a restart: the startup sweep
        assert stored(stale["id"]) == "abandoned" and stored(trained["id"]) == "created"
        assert c.get(f"/api/runs/{stale['id']}").json() == one
    monkeypatch.setattr(run_sweep, "EXPIRE_EVERY_S", 0.2)
    with TestClient(create_app(settings)) as c:
        late = c.post("/api/runs", json={"preset": "tiny", "steps": 5}).json()
        with c.websocket_connect(f"/ws/runs/{late['id']}/watch") as viewer:
            assert viewer.receive_json()["run"]["status"] == "created"
            backdate(late["id"])
            told = viewer.receive_json()                     # the sweep, within a moment
            assert told["type"] == "run" and told["run"]["status"] == "abandoned"
        assert stored(late["id"]) == "abandoned" and stored(fresh["id"]) == "created"

def test_unknown_run_page_is_a_404_page_that_says_so(client):
    r = client.get("/runs/nope")
    assert r.status_code == 404 and "There is no run nope" in r.text
    assert "resume-run" not in r.text
