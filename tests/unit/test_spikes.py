"""Spike detection on synthetic records (server/spikes.py): planted spikes are found with their
ratio to the running level, the phase boundary they follow and the outlier row that caused
them; a healthy run's noise, the run's first steps and a clip that keeps firing are not spikes."""

import math
import random

from andrea.spikes import BOUNDARY, FACTOR, QUIET, find_spikes, outlier_rows


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
