"""The anatomy of a spike (server/spike_anatomy.py through spikes.SpikeFinder), on synthetic
records laid out by the real parameter table of the tiny model: the tensor and the layer that
carry a planted spike's gradient with their shares, planted non-finite counts, a collapsed
softmax and grown logits flagged, and nothing flagged on a healthy run."""

from __future__ import annotations

import math
import random

import pytest

from andrea.metrics import MAX_LAYERS, MAX_TENSORS
from andrea.run_config import RunConfig, run_layout
from andrea.spike_anatomy import COLLAPSE_DENOM, LOGIT_FACTOR, TOP_TENSORS
from andrea.spikes import find_spikes

TENSORS = run_layout(RunConfig(preset="tiny"))["params"]    # (name, layer, ...) as the route passes
NAMES = [p["name"] for p in TENSORS]
HOT = "model.layers.1.mlp.down_proj.weight"


def healthy(n=120, seed=0, planted=None):
    """n records of a healthy run: every tensor's norm wanders +-20% around 0.1 (grad_norm their
    root sum of squares), logits around 8, softmax denominators around 40, nothing
    non-finite. `planted`: {step: {field: value}} overrides; "hot": a norm for HOT, the step's
    grad_norm made again to match."""
    rnd = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        norms = [0.1 * (1 + rnd.uniform(-0.2, 0.2)) for _ in NAMES]
        extra = dict((planted or {}).get(step, {}))
        if "hot" in extra:
            norms[NAMES.index(HOT)] = extra.pop("hot")
        r = {"step": step, "loss": 5.0 - step / n, "clip_scale": 1.0, "lr": 1e-3,
             "grad_norm": math.sqrt(sum(x * x for x in norms)), "tensor_grad_norms": norms,
             "grad_nonfinite": 0, "logit_max": 8.0 * (1 + rnd.uniform(-0.1, 0.1)),
             "softmax_denom_min": 40.0 * (1 + rnd.uniform(-0.2, 0.2))}
        r.update(extra)
        out.append(r)
    return out


def test_max_tensors_is_the_table_of_the_largest_model():
    assert RunConfig.model_json_schema()["properties"]["n_layer"]["anyOf"][0]["maximum"] == \
        MAX_LAYERS
    biggest = run_layout(RunConfig(preset="tiny", n_layer=MAX_LAYERS))
    assert len(biggest["params"]) == MAX_TENSORS


def test_the_layout_names_each_tensors_layer():
    layout = run_layout(RunConfig(preset="tiny", n_layer=13))
    layer = {p["name"]: p["layer"] for p in layout["params"]}
    assert [layer[n] for n in (NAMES[0], HOT, "model.layers.12.input_layernorm.weight",
                               NAMES[-1])] == ["embed", "layer 1", "layer 12", "final norm"]
    # Every tensor of a layer is named for it, and the table meets the layers in their order.
    assert all(p["layer"] == f"layer {p['name'].split('.')[2]}"
               for p in TENSORS if p["name"].startswith("model.layers."))
    assert list(dict.fromkeys(p["layer"] for p in TENSORS)) == [
        "embed", "layer 0", "layer 1", "final norm"]


def test_a_healthy_run_with_every_new_field_has_no_spikes_and_no_flags():
    assert find_spikes(healthy(seed=1), TENSORS) == []
    assert find_spikes(healthy(seed=2, n=600), TENSORS) == []


def test_a_spike_carried_by_one_tensor_names_it_with_its_share_and_layer():
    records = healthy(planted={60: {"hot": 2.0}})
    (s,) = find_spikes(records, TENSORS)
    norms = records[59]["tensor_grad_norms"]
    total = sum(x * x for x in norms)
    assert math.isclose(total, s["grad_norm"] ** 2)       # the global norm is their root
    top = s["tensors"][0]
    assert top == {"index": NAMES.index(HOT), "name": HOT, "norm": 2.0, "share": top["share"]}
    assert math.isclose(top["share"], 4.0 / total) and top["share"] > 0.5
    assert len(s["tensors"]) == TOP_TENSORS
    shares = [t["share"] for t in s["tensors"]]
    assert shares == sorted(shares, reverse=True)
    for t in s["tensors"]:
        assert t["name"] == NAMES[t["index"]] and math.isclose(t["share"], t["norm"] ** 2 / total)
    layer1 = [x for x, n in zip(norms, NAMES) if n.startswith("model.layers.1.")]
    want = sum(x * x for x in layer1)
    assert s["layer"]["name"] == "layer 1"
    assert math.isclose(s["layer"]["share"], want / total)
    assert math.isclose(s["layer"]["norm"], math.sqrt(want))
    assert s["numerical"] == [] and "nonfinite" not in s    # its logits were healthy
    assert 7.2 <= s["logit_max"] <= 8.8 and s["softmax_denom_min"] >= 32


def test_unnamed_tensors_keep_their_index_and_give_no_layer():
    (s,) = find_spikes(healthy(planted={60: {"hot": 2.0}}))
    assert s["tensors"][0]["index"] == NAMES.index(HOT) and s["tensors"][0]["name"] is None
    assert s["layer"] is None


def test_shares_hold_for_huge_and_zero_norms():
    records = healthy(planted={60: {"hot": 1e200}})
    records[59]["grad_norm"] = 1e200
    (s,) = find_spikes(records, TENSORS)
    assert s["tensors"][0]["name"] == HOT and math.isclose(s["tensors"][0]["share"], 1.0)
    zero = healthy(planted={60: {"grad_norm": 9.0, "tensor_grad_norms": [0.0] * len(NAMES)}})
    (s,) = find_spikes(zero, TENSORS)
    assert s["tensors"] == [] and s["layer"] is None


def test_a_record_without_tensor_norms_has_no_tensor_anatomy():
    records = healthy(planted={60: {"grad_norm": 9.0}})
    del records[59]["tensor_grad_norms"]
    (s,) = find_spikes(records, TENSORS)
    assert "tensors" not in s and "layer" not in s


def test_non_finite_elements_raise_a_spike_with_a_finite_norm_and_say_where():
    counts = [0] * len(NAMES)
    counts[3], counts[10], counts[-1] = 5, 9, 2
    records = healthy(planted={70: {"grad_nonfinite": 16, "tensor_nonfinite": counts}})
    (s,) = find_spikes(records, TENSORS)
    assert s["step"] == 70 and s["reasons"] == ["16 non-finite gradient elements"]
    assert s["ratio"] < 3 and s["grad_norm"] is not None    # the norm itself looked fine
    assert s["nonfinite"] == {"total": 16, "affected": 3, "tensors": [
        {"index": 10, "name": NAMES[10], "count": 9}, {"index": 3, "name": NAMES[3], "count": 5},
        {"index": len(NAMES) - 1, "name": "model.norm.weight", "count": 2}]}
    (flag,) = s["numerical"]
    assert flag["flag"] == "nonfinite_grad" and flag["text"].startswith("16 non-finite")
    (one,) = find_spikes(healthy(planted={70: {"grad_nonfinite": 1}}), TENSORS)
    assert one["reasons"] == ["1 non-finite gradient element"]
    assert one["nonfinite"] == {"total": 1, "affected": 0, "tensors": []}


def test_a_non_finite_norm_with_non_finite_elements_gives_both_reasons():
    (s,) = find_spikes(healthy(planted={70: {"grad_norm": None, "grad_nonfinite": 4}}), TENSORS)
    assert s["reasons"] == ["non-finite grad norm", "4 non-finite gradient elements"]


@pytest.mark.parametrize("denom,flagged", [(1.004, True), (1.0, True), (COLLAPSE_DENOM, False),
                                           (1.5, False)])
def test_a_collapsed_softmax_is_flagged(denom, flagged):
    (s,) = find_spikes(healthy(planted={60: {"hot": 2.0, "softmax_denom_min": denom}}), TENSORS)
    flags = [f for f in s["numerical"] if f["flag"] == "softmax_collapse"]
    assert bool(flags) == flagged and s["softmax_denom_min"] == denom
    if flagged:     # the top token's probability is 1 / the denominator
        assert f"holds {1 / denom:.2%} of its probability" in flags[0]["text"]


@pytest.mark.parametrize("factor,flagged", [(LOGIT_FACTOR * 1.2, True), (LOGIT_FACTOR * 0.8,
                                                                           False)])
def test_logits_grown_past_their_running_median_are_flagged(factor, flagged):
    records = healthy(planted={60: {"hot": 2.0}})
    level = sorted(r["logit_max"] for r in records[9:59])[25]    # the 50 steps before, median
    records[59]["logit_max"] = factor * level
    (s,) = find_spikes(records, TENSORS)
    assert [f["flag"] for f in s["numerical"]] == (["logit_growth"] if flagged else [])
    if flagged:
        assert f"{factor:.1f}x the median of the last 50 steps" in s["numerical"][0]["text"]


def test_no_logit_growth_is_judged_before_the_history_is_there():
    planted = {5: {"grad_norm": None, "logit_max": 500.0}}
    (s,) = find_spikes(healthy(planted=planted), TENSORS)
    assert s["numerical"] == []


def test_a_softmax_collapsed_all_along_is_not_flagged_at_a_spike():
    """A trained model predicts some rows with certainty at every step (denominator 1.000 on
    every H200 run): only a collapse that is new at the spike is flagged."""
    records = healthy(planted={60: {"hot": 2.0}})
    for r in records:
        r["softmax_denom_min"] = 1.0
    (s,) = find_spikes(records, TENSORS)
    assert not [f for f in s["numerical"] if f["flag"] == "softmax_collapse"]
