"""The websocket protocol against a real uvicorn server with a real websocket client."""

import json
import math
import sqlite3
from csv import DictReader
from io import StringIO

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.metrics import COLUMNS, MAX_TENSORS, MLP_HIST_BINS, mlp_hist_labels
from andrea.run_config import RunConfig, run_layout
from andrea.telemetry import MAX_MESSAGE_BYTES, MAX_RECORDS, RECORDS_PER_MESSAGE
from tests.trainer_client import hello, new_run, reconnected, ws_url

# The tiny model's parameter tensors (new_run's default): one per-tensor entry each.
TENSORS = [p["name"] for p in run_layout(RunConfig(preset="tiny"))["params"]]
N = len(TENSORS)
LAYERS = run_layout(RunConfig(preset="tiny"))["config"]["n_layer"]
NORMS = [p["name"] for p in run_layout(RunConfig(preset="tiny"))["params"] if len(p["shape"]) == 1]


def record(step, loss=None):
    return {"step": step, "loss": 5.0 - step * 0.01 if loss is None else loss,
            "grad_norm": 1.5, "clip_scale": 0.66, "lr": 1e-3, "tokens_per_s": 100.0,
            "step_ms": 12.0}


def send_metrics(ws, records):
    ws.send(json.dumps({"type": "metrics", "records": records}))
    return json.loads(ws.recv(timeout=10))


def metrics(live_server, run_id):
    return httpx.get(f"{live_server}/api/runs/{run_id}/metrics").json()


def test_reconnect_and_resend_lose_nothing_and_duplicate_nothing(live_server, server_data_dir):
    run = new_run(live_server)
    url = ws_url(live_server, f"/ws/runs/{run['id']}")
    with connect(url) as ws:
        assert hello(ws, run["token"]) == {"type": "welcome", "last_committed_step": None,
                                           "records_per_message": RECORDS_PER_MESSAGE,
                                           "max_message_bytes": MAX_MESSAGE_BYTES}
        assert send_metrics(ws, [record(s) for s in range(1, 6)]) == {"type": "ack", "step": 5}
        ws.send(json.dumps({"type": "metrics", "records": [record(s) for s in range(6, 9)]}))
        # Drop the connection before reading the ack: the client cannot know 6..8 landed.
    with reconnected(url, run["token"], last=5) as (ws, welcome):
        assert welcome["last_committed_step"] == 8
        # A client that resends everything after its last ack changes nothing...
        assert send_metrics(ws, [record(s, loss=99.0) for s in range(6, 9)])["step"] == 8
        assert send_metrics(ws, [record(s) for s in range(9, 11)])["step"] == 10
    rows = metrics(live_server, run["id"])
    assert [r["step"] for r in rows] == list(range(1, 11))          # each step exactly once
    assert all(r["loss"] != 99.0 for r in rows)                        # first write wins
    # ...and the SQLite file on disk holds the same.
    db = sqlite3.connect(server_data_dir / "andrea.sqlite")
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT step) FROM metrics WHERE run_id = ?",
                      (run["id"],)).fetchone() == (10, 10)


def test_viewer_gets_backlog_then_live_records(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as trainer:
        hello(trainer, run["token"])
        send_metrics(trainer, [record(1), record(2)])
        with connect(ws_url(live_server, f"/ws/runs/{run['id']}/watch")) as viewer:
            assert json.loads(viewer.recv(timeout=10))["type"] == "run"
            backlog = json.loads(viewer.recv(timeout=10))
            assert [r["step"] for r in backlog["records"]] == [1, 2]
            send_metrics(trainer, [record(3)])
            live = json.loads(viewer.recv(timeout=10))
            assert live["type"] == "records" and [r["step"] for r in live["records"]] == [3]
            trainer.send(json.dumps({"type": "status", "status": "finished"}))
            assert json.loads(viewer.recv(timeout=10))["run"]["status"] == "finished"


def test_non_finite_loss_is_stored_as_null(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        r = record(1)
        r["loss"] = None
        r["grad_norm"] = None
        assert send_metrics(ws, [r])["step"] == 1
    assert metrics(live_server, run["id"])[0]["loss"] is None


def expect_close(ws, code):
    with pytest.raises(ConnectionClosed) as e:
        for _ in range(5):
            msg = json.loads(ws.recv(timeout=10))
            assert msg["type"] == "error" and msg["message"]
    assert e.value.rcvd.code == code, e.value


BAD = {
    "not-json": ("not json", 1003),
    "missing-fields": (json.dumps({"type": "metrics", "records": [{"step": 1}]}), 1003),
    "wrong-type": (json.dumps({"type": "metrics", "records": [{**record(1), "step": "one"}]}),
                   1003),
    "extra-field": (json.dumps({"type": "metrics", "records": [{**record(1), "x": 1}]}), 1003),
    "nan": ('{"type": "metrics", "records": [{"step": 1, "loss": NaN, "grad_norm": 1,'
            ' "clip_scale": 1, "lr": 0.1}]}', 1003),
    "too-many-records": (json.dumps({"type": "metrics",
                                     "records": [record(1)] * (MAX_RECORDS + 1)}), 1003),
    "huge": (json.dumps({"type": "metrics", "records": [record(1)] * 9000}), 1009),
    "unknown-type": (json.dumps({"type": "launch"}), 1003),
    "negative-time": (json.dumps({"type": "metrics", "records": [{**record(1), "opt_ms": -1}]}),
                      1003),
    # Past what the store's integers hold (they crashed the insert, and the page resent it).
    "phase-past-any-step": (json.dumps({"type": "metrics", "records": [
        {**record(1), "phase": 2**63}]}), 1003),
    "count-past-any-model": (json.dumps({"type": "metrics", "records": [
        {**record(1), "grad_nonfinite": 2**64}]}), 1003),
    # row_losses: one mean loss per row of the run's batch (tiny's default: 8 rows).
    "row-losses-wrong-length": (json.dumps({"type": "metrics", "records": [
        record(2), {**record(3), "row_losses": [4.5] * 3}]}), 1003),
    "row-losses-negative": (json.dumps({"type": "metrics", "records": [
        {**record(2), "row_losses": [4.5] * 7 + [-0.5]}]}), 1003),
    "row-losses-not-numbers": (json.dumps({"type": "metrics", "records": [
        {**record(2), "row_losses": "4.5"}]}), 1003),
    "row-losses-too-long": (json.dumps({"type": "metrics", "records": [
        {**record(2), "row_losses": [4.5] * 1025}]}), 1003),
}


def bad_record(**fields) -> str:
    """A metrics message of a good step 2 and a step 3 with `fields` (json.dumps writes NaN)."""
    return json.dumps({"type": "metrics", "records": [record(2), {**record(3), **fields}]})


# The anatomy fields: per-tensor lists one per tensor of the run's layout; tensor_nonfinite
# only with a grad_nonfinite above 0, adding up to it. Each (message, field named).
BAD_ANATOMY = {
    "norms-short": (bad_record(tensor_grad_norms=[0.5] * (N - 1)), "tensor_grad_norms"),
    "norms-long": (bad_record(tensor_grad_norms=[0.5] * (N + 1)), "tensor_grad_norms"),
    "norms-past-any-model": (bad_record(tensor_grad_norms=[0.5] * (MAX_TENSORS + 1)),
                             "tensor_grad_norms"),
    "norms-negative": (bad_record(tensor_grad_norms=[0.5] * (N - 1) + [-0.5]),
                       "tensor_grad_norms"),
    "norms-nan": (bad_record(tensor_grad_norms=[math.nan] + [0.5] * (N - 1)),
                  "tensor_grad_norms"),
    "norms-infinite": (bad_record(tensor_grad_norms=[math.inf] + [0.5] * (N - 1)),
                       "tensor_grad_norms"),
    "norms-strings": (bad_record(tensor_grad_norms=["0.5"] * N), "tensor_grad_norms"),
    "norms-not-a-list": (bad_record(tensor_grad_norms=0.5), "tensor_grad_norms"),
    "nonfinite-negative": (bad_record(grad_nonfinite=-1), "grad_nonfinite"),
    "nonfinite-float": (bad_record(grad_nonfinite=2.0), "grad_nonfinite"),
    "nonfinite-bool": (bad_record(grad_nonfinite=True), "grad_nonfinite"),
    "per-tensor-without-total": (bad_record(tensor_nonfinite=[1] + [0] * (N - 1)),
                                 "tensor_nonfinite"),
    "per-tensor-with-zero-total": (bad_record(grad_nonfinite=0,
                                              tensor_nonfinite=[0] * N), "tensor_nonfinite"),
    "per-tensor-wrong-sum": (bad_record(grad_nonfinite=3, tensor_nonfinite=[2] + [0] * (N - 1)),
                             "tensor_nonfinite"),
    "per-tensor-short": (bad_record(grad_nonfinite=2, tensor_nonfinite=[2] + [0] * (N - 2)),
                         "tensor_nonfinite"),
    "per-tensor-negative": (bad_record(grad_nonfinite=1,
                                       tensor_nonfinite=[2, -1] + [0] * (N - 2)),
                            "tensor_nonfinite"),
    "per-tensor-float": (bad_record(grad_nonfinite=1, tensor_nonfinite=[1.0] + [0] * (N - 1)),
                         "tensor_nonfinite"),
    "logit-max-negative": (bad_record(logit_max=-1.0), "logit_max"),
    "logit-max-nan": (bad_record(logit_max=math.nan), "logit_max"),
    "logit-max-string": (bad_record(logit_max="9"), "logit_max"),
    "denom-negative": (bad_record(softmax_denom_min=-0.5), "softmax_denom_min"),
    "denom-infinite": (bad_record(softmax_denom_min=math.inf), "softmax_denom_min"),
    # The inside (an eval step's): one RMS per norm gain, one entry per layer, one ratio per
    # tensor; histograms of MLP_HIST_BINS counts.
    "resid-short": (bad_record(resid_rms=[1.0] * (2 * LAYERS)), "resid_rms"),
    "resid-negative": (bad_record(resid_rms=[1.0] * 2 * LAYERS + [-1.0]), "resid_rms"),
    "dead-long": (bad_record(mlp_dead=[0.0] * (LAYERS + 1)), "mlp_dead"),
    "dead-past-one": (bad_record(mlp_dead=[0.0] * (LAYERS - 1) + [1.5]), "mlp_dead"),
    "hist-per-layer": (bad_record(mlp_hist=[[1] * MLP_HIST_BINS] * (LAYERS - 1)), "mlp_hist"),
    "hist-bins": (bad_record(mlp_hist=[[1] * (MLP_HIST_BINS + 1)] * LAYERS), "mlp_hist"),
    "hist-negative": (bad_record(mlp_hist=[[1] * (MLP_HIST_BINS - 1) + [-1]] * LAYERS),
                      "mlp_hist"),
    "ratio-short": (bad_record(update_ratio=[0.001] * (N - 1)), "update_ratio"),
    "ratio-nan": (bad_record(update_ratio=[math.nan] * N), "update_ratio"),
}


def test_row_losses_are_stored_served_and_kept_with_non_finite_rows(live_server):
    run = new_run(live_server, batch_size=4)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        rows = [4.5, 6.25, None, 3.0]   # a row whose loss was not finite is None
        assert send_metrics(ws, [{**record(1), "row_losses": rows}, record(2)]) == \
            {"type": "ack", "step": 2}
    got = metrics(live_server, run["id"])
    assert got[0]["row_losses"] == rows and "row_losses" not in got[1]


@pytest.mark.parametrize("payload,code", list(BAD.values()), ids=list(BAD))
def test_bad_messages_close_with_a_clear_error(live_server, payload, code):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}"), max_size=None) as ws:
        hello(ws, run["token"])
        send_metrics(ws, [record(1)])
        ws.send(payload)
        expect_close(ws, code)
    # Committed data survives the bad message.
    assert [r["step"] for r in metrics(live_server, run["id"])] == [1]


def test_wrong_token_unknown_run_and_origin_are_refused(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        ws.send(json.dumps({"type": "hello", "token": "guess"}))
        expect_close(ws, 1008)
    with connect(ws_url(live_server, "/ws/runs/nope")) as ws:
        ws.send(json.dumps({"type": "hello", "token": "x"}))
        expect_close(ws, 1008)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        ws.send(json.dumps({"type": "ping"}))   # hello must come first
        expect_close(ws, 1008)
    with pytest.raises(Exception):
        with connect(ws_url(live_server, f"/ws/runs/{run['id']}"),
                     origin="http://evil.example") as ws:
            ws.recv(timeout=10)


def test_metrics_csv_export(live_server):
    run = new_run(live_server)
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        send_metrics(ws, [record(1), record(2)])
    csv = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics?format=csv").text.splitlines()
    assert csv[0].startswith("step,loss,grad_norm,clip_scale,lr")
    assert len(csv) == 3 and math.isclose(float(csv[1].split(",")[1]), 4.99)


def test_bad_anatomy_fields_close_1003_naming_the_field_and_the_step(live_server):
    """Each bad message on a socket of its own (one run: new runs are rate-limited): closed
    1003 with a message that names the field and the step, and nothing of it committed."""
    run = new_run(live_server)
    url = ws_url(live_server, f"/ws/runs/{run['id']}")
    with connect(url) as ws:
        hello(ws, run["token"])
        send_metrics(ws, [record(1)])
    for case, (payload, field) in BAD_ANATOMY.items():
        with reconnected(url, run["token"], last=1) as (ws, welcome):
            assert welcome["type"] == "welcome", welcome
            ws.send(payload)
            msg = json.loads(ws.recv(timeout=10))
            assert msg["type"] == "error" and field in msg["message"], (case, msg)
            assert "step 3" in msg["message"], (case, msg)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1003, case
    assert [r["step"] for r in metrics(live_server, run["id"])] == [1]   # not even step 2


def anatomy_records():
    """Step 1 with every anatomy field (a non-finite tensor's norm is None, its elements
    counted), step 2 with no non-finite element, step 3 without any of them."""
    norms = [round(0.01 * (i + 1), 7) for i in range(N)]
    norms[4] = None
    counts = [0] * N
    counts[4], counts[N - 1] = 6, 1
    return [{**record(1), "tensor_grad_norms": norms, "grad_nonfinite": 7,
             "tensor_nonfinite": counts, "logit_max": 23.5, "softmax_denom_min": 1.0},
            {**record(2), "tensor_grad_norms": norms[:4] + [0.25] + norms[5:],
             "grad_nonfinite": 0, "logit_max": 11.0, "softmax_denom_min": 812.5},
            record(3)]


def test_anatomy_fields_are_stored_served_and_exported(live_server, server_data_dir):
    run = new_run(live_server)
    assert [p["name"] for p in run["layout"]["params"]] == TENSORS
    sent = anatomy_records()
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        with connect(ws_url(live_server, f"/ws/runs/{run['id']}/watch")) as viewer:
            assert json.loads(viewer.recv(timeout=10))["type"] == "run"
            assert send_metrics(ws, sent) == {"type": "ack", "step": 3}
            live = json.loads(viewer.recv(timeout=10))["records"]
    got = metrics(live_server, run["id"])
    for rows in (got, live):
        assert [{k: v for k, v in r.items() if k != "time"} for r in rows] == sent
    # The numbers are columns of their own; the lists are the row's JSON.
    db = sqlite3.connect(server_data_dir / "andrea.sqlite")
    assert db.execute("SELECT grad_nonfinite, logit_max, softmax_denom_min FROM metrics WHERE"
                      " run_id = ? ORDER BY step", (run["id"],)).fetchall() == [
        (7, 23.5, 1.0), (0, 11.0, 812.5), (None, None, None)]
    # CSV: the record's numbers, then each tensor's grad norm by its layout name.
    text = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics?format=csv").text
    header, *rows = [line.split(",") for line in text.splitlines()]
    assert header[:len(COLUMNS) + N] == [*COLUMNS, *(f"grad_norm:{name}" for name in TENSORS)]
    for row, want in zip(rows, sent):
        cells = dict(zip(header, row))
        assert cells["grad_nonfinite"] == str(want.get("grad_nonfinite", ""))
        norms = [cells[f"grad_norm:{name}"] for name in TENSORS]
        assert norms == ["" if x is None else repr(x)
                         for x in want.get("tensor_grad_norms", [None] * N)]


def inside(k: int) -> dict:
    """An eval step's inside for the tiny model (server/metrics.py), its numbers made from k."""
    return {"resid_rms": [round(1 + 0.1 * i + k, 6) for i in range(2 * LAYERS + 1)],
            "mlp_dead": [round(0.01 * (layer + k), 6) for layer in range(LAYERS)],
            "mlp_hist": [[layer + k + b for b in range(MLP_HIST_BINS)] for layer in range(LAYERS)],
            "update_ratio": [None] + [round(1e-3 * (i + k), 9) for i in range(1, N)]}


def test_the_inside_is_stored_served_and_exported_a_column_per_entry(live_server):
    """An eval step's inside round-trips through the store; the CSV has a column per norm, per
    layer (dead share, each histogram bin) and per tensor (update ratio), empty on the steps
    without it."""
    run = new_run(live_server)
    sent = [{**record(1), **inside(1)}, record(2), {**record(3), **inside(3)}]
    with connect(ws_url(live_server, f"/ws/runs/{run['id']}")) as ws:
        hello(ws, run["token"])
        assert send_metrics(ws, sent) == {"type": "ack", "step": 3}
    got = metrics(live_server, run["id"])
    assert [{k: v for k, v in r.items() if k != "time"} for r in got] == sent
    text = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics?format=csv").text
    rows = list(DictReader(StringIO(text)))
    labels = mlp_hist_labels()
    assert len(labels) == MLP_HIST_BINS and labels[0] == "<=-3" and labels[-1] == ">=3"
    for row, want in zip(rows, sent):
        has = "resid_rms" in want
        w = want if has else inside(0)

        def cells(cols):
            return [row[c] for c in cols]

        def fmt(xs):
            return ["" if x is None or not has else repr(x) for x in xs]
        assert cells(f"resid_rms:{n}" for n in NORMS) == fmt(w["resid_rms"])
        assert cells(f"mlp_dead:layer {i}" for i in range(LAYERS)) == fmt(w["mlp_dead"])
        assert cells(f"mlp_hist:layer {i}:{b}" for i in range(LAYERS) for b in labels) == fmt(
            [c for layer in w["mlp_hist"] for c in layer])
        assert cells(f"update_ratio:{n}" for n in TENSORS) == fmt(w["update_ratio"])
