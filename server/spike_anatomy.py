"""The anatomy of a gradient spike, from its step's record alone: which parameter tensors (and
which layer) carry the step's gradient, where its non-finite elements are, and what the loss
kernel saw (numerical flags). Pure: spikes.py calls it for each spike it finds, with the
running level of the logits it keeps.

- tensors: the TOP_TENSORS tensors by share of the step's sum of squared tensor norms
  (tensor_grad_norms; the global grad norm is the root of that sum), and the layer whose
  tensors together hold the largest share;
- nonfinite: the step's count of non-finite gradient elements and the tensors holding most;
- numerical flags: non-finite gradient elements; a collapsed softmax (a row whose top token
  holds over 1/COLLAPSE_DENOM of its probability, the degenerate attractor of a softmax) where
  the run's rows were not collapsed before (a trained model predicts some rows with certainty
  all the time: seen on every H200 run, bench/results/clip_experiment_h200.txt; only a new
  collapse says something about this step); logits grown to LOGIT_FACTOR times their running
  level.
"""

from __future__ import annotations

import math

TOP_TENSORS = 5         # tensors listed per spike (by share; by non-finite count)
# A row's top token holds 1 / denominator of its probability (max-subtracted form: its own
# term is exp(0) = 1), so a denominator below this is a row over 99% on one token.
COLLAPSE_DENOM = 1.01
LOGIT_FACTOR = 3.0      # logit growth: the step's largest |logit| >= this x its running level

def _name(tensors: list[dict] | None, i: int) -> str | None:
    return tensors[i]["name"] if tensors is not None and i < len(tensors) else None


def tensor_shares(norms: list[float | None], tensors: list[dict] | None) -> dict:
    """{tensors: [{index, name, norm, share}] (the TOP_TENSORS largest shares), layer: {name,
    norm, share} | None (None: no layout)}; `tensors` the run's layout's parameter entries
    (name, layer), in order; share = norm^2 / the sum of all norm^2 (non-finite
    tensors, None, left out). Empty tensors and no layer when every norm is 0 or None."""
    finite = [(i, x) for i, x in enumerate(norms) if x is not None]
    top = max((x for _, x in finite), default=0.0)
    if top <= 0:
        return {"tensors": [], "layer": None}
    # Squares of norms scaled by the largest: no overflow, whatever the magnitudes.
    squares = {i: (x / top) ** 2 for i, x in finite}
    total = sum(squares.values())
    ranked = sorted(finite, key=lambda f: (-squares[f[0]], f[0]))[:TOP_TENSORS]
    top_tensors = [{"index": i, "name": _name(tensors, i), "norm": x,
                    "share": squares[i] / total} for i, x in ranked]
    if tensors is None:
        return {"tensors": top_tensors, "layer": None}
    layers: dict[str, float] = {}
    for i, sq in squares.items():
        if i < len(tensors):
            layer = tensors[i]["layer"]
            layers[layer] = layers.get(layer, 0.0) + sq
    name, sq = max(layers.items(), key=lambda kv: kv[1])    # the first of equal shares
    return {"tensors": top_tensors,
            "layer": {"name": name, "norm": top * math.sqrt(sq), "share": sq / total}}


def nonfinite_counts(record: dict, tensors: list[dict] | None) -> dict | None:
    """{total, affected, tensors: [{index, name, count}]} of a step with non-finite gradient
    elements (the TOP_TENSORS tensors holding most; affected: how many hold any), else None."""
    total = record.get("grad_nonfinite") or 0
    if total <= 0:
        return None
    counts = [(i, c) for i, c in enumerate(record.get("tensor_nonfinite") or []) if c > 0]
    counts.sort(key=lambda ic: (-ic[1], ic[0]))
    return {"total": total, "affected": len(counts),
            "tensors": [{"index": i, "name": _name(tensors, i), "count": c}
                        for i, c in counts[:TOP_TENSORS]]}


def numerical_flags(record: dict, logit_level: float | None, history: int,
                    denom_level: float | None = None) -> list[dict]:
    """[{flag, text}] of what the loss kernel and the gradients show at this step:
    nonfinite_grad, softmax_collapse, logit_growth (`logit_level`: the median largest |logit|
    of the `history` steps before, None while there are too few; `denom_level`: the median
    smallest softmax denominator of those steps: a collapse is flagged only where it is new)."""
    flags = []
    bad = record.get("grad_nonfinite") or 0
    if bad > 0:
        flags.append({"flag": "nonfinite_grad", "text": (
            f"{bad} non-finite gradient element{'s' * (bad != 1)} (NaN or infinity), left out "
            "of the grad norm")})
    denom = record.get("softmax_denom_min")
    chronic = denom_level is not None and denom_level < COLLAPSE_DENOM
    if denom is not None and denom < COLLAPSE_DENOM and not chronic:
        top = 1.0 / max(denom, 1.0)
        flags.append({"flag": "softmax_collapse", "text": (
            f"softmax collapse: a row's top token holds {top:.2%} of its probability "
            f"(smallest softmax denominator {denom:.4g})")})
    logit = record.get("logit_max")
    if logit is not None and logit_level and logit >= LOGIT_FACTOR * logit_level:
        flags.append({"flag": "logit_growth", "text": (
            f"largest |logit| {logit:.4g}, {logit / logit_level:.1f}x the median of the last "
            f"{history} steps")})
    return flags


def anatomy(record: dict, tensors: list[dict] | None, logit_level: float | None,
            history: int, denom_level: float | None = None) -> dict:
    """What a spike adds from its record: logit_max, softmax_denom_min, numerical, and where
    sent, tensors and layer (tensor_grad_norms) and nonfinite (grad_nonfinite above 0)."""
    out = {"logit_max": record.get("logit_max"),
           "softmax_denom_min": record.get("softmax_denom_min"),
           "numerical": numerical_flags(record, logit_level, history, denom_level)}
    if record.get("tensor_grad_norms") is not None:
        out.update(tensor_shares(record["tensor_grad_norms"], tensors))
    if (nonfinite := nonfinite_counts(record, tensors)) is not None:
        out["nonfinite"] = nonfinite
    return out
