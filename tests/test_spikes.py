"""Spike detection on synthetic records (server/spikes.py): planted spikes are found with their
ratio to the running level, the phase boundary they follow and the outlier row that caused
them; a healthy run's noise, the run's first steps and a clip that keeps firing are not spikes."""

import math
import random

import pytest

from andrea.config import Settings
from andrea.spikes import BOUNDARY, FACTOR, QUIET, find_spikes, outlier_rows


@pytest.fixture
def settings(tmp_path) -> Settings:
    """Each spike list current: these tests read a run's spikes right after its trainer's
    records (the window a trained run's list may lag, spikes_fresh_s, is tested in
    test_web_reads.py)."""
    return Settings(data_dir=tmp_path / "data", spikes_fresh_s=0)


def run(planted=None, n=120, seed=0):
    """n records with a grad norm that wanders +-20% around 1.0 and no clipping; `planted`:
    {step: {field: value}} overrides."""
    planted = planted or {}
    rnd = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        r = {"step": step, "loss": 5.0 - step / n, "grad_norm": 1.0 + rnd.uniform(-0.2, 0.2),
             "clip_scale": 1.0, "lr": 1e-3}
        r.update(planted.get(step, {}))
        out.append(r)
    return out


def test_a_healthy_run_has_no_spikes():
    assert find_spikes(run(seed=1)) == []
    assert find_spikes(run(seed=2, n=1000)) == []


def test_a_planted_spike_is_found_with_its_ratio_to_the_running_median():
    spikes = find_spikes(run({60: {"grad_norm": 5.0}}))
    assert [s["step"] for s in spikes] == [60]
    s = spikes[0]
    assert 0.8 < s["level"] < 1.2 and math.isclose(s["ratio"], 5.0 / s["level"])
    assert s["reasons"][0].startswith("grad norm") and s["boundary"] is None
    assert s["kinds"] == ["ratio"] and s["level_steps"] == 50   # the median of the 50 before it
    early = find_spikes(run({15: {"grad_norm": 5.0}}))[0]
    assert early["level_steps"] == 14 and "last 14 steps" in early["reasons"][0]


def test_back_to_back_spikes_do_not_lift_the_level_they_are_judged_by():
    planted = {s: {"grad_norm": 4.0} for s in range(70, 75)}
    spikes = find_spikes(run(planted))
    assert [s["step"] for s in spikes] == list(range(70, 75))
    assert all(s["ratio"] > FACTOR for s in spikes)


def test_the_first_steps_are_never_judged_by_a_ratio():
    assert find_spikes(run({3: {"grad_norm": 50.0}})) == []


def test_a_spike_just_after_a_phase_boundary_names_the_phases():
    records = run()
    for r in records:
        r["phase"] = 0 if r["step"] <= 40 else 1
    records[41]["grad_norm"] = 6.0                       # step 42: one step after the change
    records[89]["grad_norm"] = 6.0                       # step 90: far from it
    spikes = find_spikes(records)
    assert [s["step"] for s in spikes] == [42, 90]
    assert spikes[0]["boundary"] == {"phase": 1, "previous": 0, "steps_after": 1}
    assert spikes[1]["boundary"] is None
    records[40 + BOUNDARY + 1]["grad_norm"] = 6.0        # just past the boundary's reach
    assert find_spikes(records)[1]["boundary"] is None


def test_an_outlier_row_is_named_first():
    rows = [4.1, 3.9, 9.5, 4.0]
    spikes = find_spikes(run({50: {"grad_norm": 7.0, "loss": 5.375, "row_losses": rows}}))
    (s,) = spikes
    assert s["rows"][0] == {"row": 2, "loss": 9.5, "excess": 9.5 - 5.375}
    assert [r["row"] for r in s["rows"]] == [2, 0, 3]


def test_a_non_finite_row_comes_before_every_finite_one():
    rows = outlier_rows({"loss": 4.0, "row_losses": [4.0, 12.0, None]})
    assert [r["row"] for r in rows] == [2, 1, 0] and rows[0]["excess"] is None


def test_a_clip_after_a_quiet_stretch_is_a_spike_and_a_clip_that_keeps_firing_is_not():
    spikes = find_spikes(run({60: {"grad_norm": 2.0, "clip_scale": 0.5}}))
    assert [s["step"] for s in spikes] == [60]
    assert spikes[0]["reasons"] == [f"clipped after {59} steps without clipping"]
    assert spikes[0]["kinds"] == ["clip"] and spikes[0]["ratio"] < FACTOR   # below the factor
    always = run({s: {"clip_scale": 0.9} for s in range(1, 121)})
    assert find_spikes(always) == []
    again = run({60: {"clip_scale": 0.5}, 60 + QUIET - 1: {"clip_scale": 0.5}})
    assert [s["step"] for s in find_spikes(again)] == [60]   # the second came too soon


def test_a_non_finite_grad_norm_is_a_spike():
    (s,) = find_spikes(run({33: {"grad_norm": None, "loss": None}}))
    assert s["step"] == 33 and s["reasons"] == ["non-finite grad norm"] and s["ratio"] is None
    assert s["kinds"] == ["nonfinite_norm"]


def test_the_spikes_route_names_each_outlier_rows_source_and_text(client):
    """Records with a planted spike go through the trainer socket; GET .../spikes finds it and
    gives its outlier row's source and text: the row of the run's own batch for that step,
    decoded with the run's tokenizer."""
    from andrea.data import tokenizer as tk
    from andrea.data import wire

    made = client.post("/api/runs", json={"preset": "tiny", "batch_size": 4, "steps": 100}).json()
    records = [{**r, "row_losses": [round(r["loss"], 3)] * 4} for r in run(n=100)]
    records[59]["grad_norm"] = 9.0                         # step 60: row 1 far above the rest
    records[59]["row_losses"] = [4.0, 11.0, 4.2, 3.9]
    with client.websocket_connect(f"/ws/runs/{made['id']}") as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": records[:80]})
        assert ws.receive_json() == {"type": "ack", "step": 80}
        got = client.get(f"/api/runs/{made['id']}/spikes").json()
        assert client.get(f"/api/runs/{made['id']}/spikes").json() == got   # (kept)
        records[89]["grad_norm"] = 8.0                     # a later spike: a new answer
        ws.send_json({"type": "metrics", "records": records[80:]})
        assert ws.receive_json() == {"type": "ack", "step": 100}
        later = client.get(f"/api/runs/{made['id']}/spikes").json()["spikes"]
        assert [s["step"] for s in later] == [60, 90]
    assert got["rule"]["factor"] == FACTOR
    (s,) = got["spikes"]
    assert s["step"] == 60 and s["rows"][0]["row"] == 1 and s["rows"][0]["loss"] == 11.0
    # What the trainer got for step 60 (0-based 59), decoded as the run's tokenizer does.
    batch = wire.decode(client.get(f"/api/runs/{made['id']}/batches/59").content)
    corpus = client.app.state.data.prepared(made["config"]["vocab_size"])
    assert s["rows"][0]["source"] == corpus.source_names[int(batch.sources[1])]
    want = tk.decode(corpus.tokenizer, batch.tokens[1][:-1])[:300]
    assert s["rows"][0]["text"] == want and len(want) > 20
    assert client.get("/api/runs/nope/spikes").status_code == 404


def test_andrea_train_prints_a_spike_in_one_line():
    from andrea.cli.train_output import spike_line

    (s,) = find_spikes(run({50: {"grad_norm": 7.0, "loss": 5.0, "row_losses": [4.0, 9.5],
                                 "phase": 2}, 49: {"phase": 1}}))
    s["rows"][0].update(source="python-docs", text="def f():\n    return 1\n")
    line = spike_line(s)
    assert line.startswith("spike at step 50: grad norm 7 (grad norm ")
    assert "; 0 step(s) after the data phase 1 -> 2;" in line   # the phase changed at 50
    assert "highest row 1 loss 9.500 from python-docs: 'def f(): return 1'" in line
    assert "\n" not in line


def test_the_spike_line_names_the_layer_tensor_and_numerical_flags():
    from andrea.cli.train_output import spike_line

    tensors = [{"name": "model.embed_tokens.weight", "layer": "embed"},
               {"name": "model.layers.0.mlp.down_proj.weight", "layer": "layer 0"},
               {"name": "model.norm.weight", "layer": "final norm"}]
    (s,) = find_spikes(run({50: {"grad_norm": 7.0, "loss": 5.0, "softmax_denom_min": 1.001,
                                 "tensor_grad_norms": [0.5, 6.97, 0.3]}}), tensors)
    line = spike_line(s)
    assert ("mostly layer 0 (99% of the squared norm; model.layers.0.mlp.down_proj.weight 99%)"
            in line)
    assert "softmax collapse" in line and "\n" not in line


def test_a_boundary_spike_names_the_sources_whose_weight_changed(client):
    """A bandit run: records carry their phase and per-source losses through the trainer socket
    (the bandit learns from them); a spike planted where a phase starts says which sources'
    sampling weights changed there, from the phases the server decided."""
    from andrea.data.bandit import PhaseSchedule

    made = client.post("/api/runs", json={"preset": "tiny", "batch_size": 4, "steps": 200,
                                          "data_mode": "bandit", "seed": 3}).json()
    phases = PhaseSchedule(3).phases_until(200)            # (index, start, length), 0-based
    phase_of = {s: k for k, start, length in phases for s in range(start, start + length)}
    k, start, _ = next(p for p in phases if p[1] >= 40)    # a boundary past MIN_HISTORY
    records = run(n=start + 1)
    for r in records:
        r["phase"] = phase_of[r["step"] - 1]
        r["source_losses"] = {"0": 3.0, "1": 5.0 * 0.98 ** r["step"]}
    records[-1]["grad_norm"] = 9.0                         # step start + 1: phase k's first
    with client.websocket_connect(f"/ws/runs/{made['id']}") as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": records})
        assert ws.receive_json() == {"type": "ack", "step": start + 1}
    assert client.get(f"/api/runs/{made['id']}/batches/{start}").status_code == 200
    decided = {p["index"]: p["weights"] for p in client.get(
        f"/api/runs/{made['id']}/data").json()["phases"]}
    (s,) = client.get(f"/api/runs/{made['id']}/spikes").json()["spikes"]
    b = s["boundary"]
    assert (b["phase"], b["previous"], b["steps_after"]) == (k, k - 1, 0)
    names = client.get("/api/corpus?preset=tiny").json()["sources"]
    want = [{"source": names[i]["name"], "before": w0, "after": w1}
            for i, (w0, w1) in enumerate(zip(decided[k - 1], decided[k])) if abs(w1 - w0) > 1e-9]
    assert want and sorted(b["weights"], key=lambda c: c["source"]) == \
        sorted(want, key=lambda c: c["source"])
    assert abs(b["weights"][0]["after"] - b["weights"][0]["before"]) == max(
        abs(c["after"] - c["before"]) for c in want)
    # A restart (or a resume) rebuilds the bandit from the records, and no batch is asked for
    # since (a finished run): the same phases, the same boundary.
    client.app.state.runs.forget(made["id"])
    assert client.get(f"/api/runs/{made['id']}/spikes").json()["spikes"] == [s]
