"""RunConfig.precision (fp32 | mixed): the run stores and serves it, `andrea train` takes it as a
flag, the model card names it; a mixed run's records carry loss_scale and skipped (stored, served,
exported), which the trainer socket refuses from an fp32 run or half sent; and a skipped step (a
gradient that overflowed under the loss scale) is not a spike."""

from __future__ import annotations

import argparse
import json
import sqlite3

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.cli.train_args import add_train_arguments, run_config
from andrea.model_card import optimizer_text
from andrea.run_config import read_stored
from andrea.spikes import find_spikes
from tests.api.test_checkpoints import put, state
from tests.api.test_telemetry import hello, metrics, new_run, record, send_metrics, ws_url
from tests.trainer_client import stored_config


def test_precision_defaults_to_fp32_and_takes_mixed(client):
    made = client.post("/api/runs", json={"preset": "tiny"})
    assert made.json()["config"]["precision"] == "fp32"
    made = client.post("/api/runs", json={"preset": "tiny", "precision": "mixed"})
    assert made.status_code == 201, made.text
    assert client.get(f"/api/runs/{made.json()['id']}").json()["config"]["precision"] == "mixed"


def test_a_mixed_runs_checkpoint_holds_its_loss_scaler(client):
    """The loss scaler (scale, clean steps, applied steps: f32 [4]) ends a mixed run's checkpoint,
    so a resume goes on with the same scale and Adam step count; an fp32 run's is as it was."""
    for optimizer in ("adamw", "adamw_8bit"):
        fp32, mixed = (client.post("/api/runs", json={
            "preset": "tiny", "optimizer": optimizer, "precision": p}).json()
            for p in ("fp32", "mixed"))
        a, b = fp32["checkpoint"]["sections"], mixed["checkpoint"]["sections"]
        assert b == [*a, {"name": "scaler", "bytes": 16}] and a[-1]["name"] != "scaler"
        body = state(mixed)
        r = put(client, mixed, 1, body)
        assert r.status_code == 201, r.text
        assert put(client, mixed, 2, body[:-16]).status_code == 400    # an fp32-sized body


@pytest.mark.parametrize("bad", ["bf16", "f16", True, None, 16])
def test_an_unknown_precision_is_422(client, bad):
    r = client.post("/api/runs", json={"preset": "tiny", "precision": bad})
    assert r.status_code == 422 and "precision" in json.dumps(r.json()["detail"])


def test_andrea_train_has_a_precision_flag():
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert run_config(parser.parse_args(["--precision", "mixed"]))["precision"] == "mixed"
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision", "bf16"])


def test_the_model_card_says_mixed_precision():
    assert "mixed precision" in optimizer_text(stored_config(precision="mixed"))
    assert "mixed" not in optimizer_text(stored_config(precision="fp32"))
    # a run stored before the field: its row has none, and reads back with RunConfig's default
    old = {k: v for k, v in stored_config().model_dump().items() if k != "precision"}
    assert "mixed" not in optimizer_text(read_stored(json.dumps(old)))


def mixed_records():
    return [{**record(1), "loss_scale": 65536.0, "skipped": True, "grad_nonfinite": 3},
            {**record(2), "loss_scale": 32768.0, "skipped": False},
            record(3) | {"loss_scale": 32768.0, "skipped": False}]


def test_loss_scale_and_skipped_are_stored_served_and_exported(live_server, server_data_dir):
    run = new_run(live_server, precision="mixed")
    sent = mixed_records()
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        assert send_metrics(ws, sent) == {"type": "ack", "step": 3}
    got = [{k: v for k, v in r.items() if k != "time"} for r in metrics(live_server, run["id"])]
    assert got == sent
    db = sqlite3.connect(server_data_dir / "andrea.sqlite")
    assert db.execute("SELECT loss_scale FROM metrics WHERE run_id = ? ORDER BY step",
                      (run["id"],)).fetchall() == [(65536.0,), (32768.0,), (32768.0,)]
    text = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics?format=csv").text
    header, *rows = [line.split(",") for line in text.splitlines()]
    assert [dict(zip(header, r))["loss_scale"] for r in rows] == ["65536.0", "32768.0", "32768.0"]


@pytest.mark.parametrize("precision,fields,why", [
    ("fp32", {"loss_scale": 1024.0, "skipped": False}, "trains in fp32"),
    ("mixed", {"loss_scale": 1024.0}, "send both or neither"),
    ("mixed", {"skipped": True}, "send both or neither"),
])
def test_loss_scale_where_it_cannot_be_closes_1003(live_server, precision, fields, why):
    run = new_run(live_server, precision=precision)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        send_metrics(ws, [record(1)])
        ws.send(json.dumps({"type": "metrics", "records": [record(2), {**record(3), **fields}]}))
        msg = json.loads(ws.recv(timeout=10))
        assert msg["type"] == "error" and why in msg["message"] and "step 3" in msg["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1003
    assert [r["step"] for r in metrics(live_server, run["id"])] == [1]   # not even step 2


@pytest.mark.parametrize("bad", [0.0, -2.0, "1024", True])
def test_a_bad_loss_scale_is_refused(live_server, bad):
    run = new_run(live_server, precision="mixed")
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        ws.send(json.dumps({"type": "metrics", "records": [
            {**record(1), "loss_scale": bad, "skipped": False}]}))
        assert json.loads(ws.recv(timeout=10))["type"] == "error"
    assert metrics(live_server, run["id"]) == []


def test_a_skipped_step_is_not_a_spike():
    """60 quiet steps, then a step whose gradient overflowed under the loss scale (non-finite
    elements, a huge norm over the finite ones, skipped): no spike; the same step unskipped is."""
    quiet = [{"step": s, "loss": 3.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}
             for s in range(1, 61)]
    bad = {"step": 61, "loss": 3.0, "grad_norm": 40.0, "clip_scale": 0.025, "lr": 1e-3,
           "grad_nonfinite": 12}
    assert [s["step"] for s in find_spikes(quiet + [bad])] == [61]
    assert find_spikes(quiet + [{**bad, "loss_scale": 65536.0, "skipped": True}]) == []
