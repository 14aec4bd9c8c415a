"""The step record: the one definition of what a training step reports.

The websocket validates it (telemetry/protocol.py), the store (SQLite or PostgreSQL) keeps a
column per number and JSON for the rest (andrea.store), the CSV export lists the numbers and
then each tensor's grad norm (services/exports.py). A new metric is a new field here and nowhere
else. One column is the server's, not the trainer's: `time`, the wall-clock time (Unix seconds)
at which the server committed the row.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Step = Annotated[int, Field(ge=0, le=1_000_000_000)]
# Counts of gradient elements: bounded by what a page's numbers hold exactly (and so a BIGINT; an
# unbounded one crashed the insert, and the page resent it forever).
Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
MAX_BATCH = 1024      # the most rows a batch has (RunConfig.batch_size's bound)
MAX_LAYERS = 64       # the most layers a model has (RunConfig.n_layer's bound)
# The most parameter tensors a run has (model.py's table): the embedding, 9 per layer (q, k, v,
# o, gate, up, down, two norms) and the final norm. tests/unit/test_spike_anatomy.py holds it to
# the table.
MAX_TENSORS = 1 + 9 * MAX_LAYERS + 1
# The MLP histogram's |h| bin edges (static/js/engine/inside_stats.js HIST_EDGES; a test holds
# the two equal) and its bins: [edge k, edge k+1) of |h| per sign, the negative side first.
MLP_HIST_EDGES = (0.001, 0.01, 0.03, 0.1, 0.3, 1, 3)
MLP_HIST_BINS = 2 * (len(MLP_HIST_EDGES) + 1)


def mlp_hist_labels() -> list[str]:
    """The MLP histogram's bins in words, in order: "<=-3", "-3..-1", ..., "-0.001..0",
    "0..0.001", ..., ">=3"."""
    e = [f"{x:g}" for x in MLP_HIST_EDGES]
    inner = list(zip(e, e[1:]))
    neg = [f"<=-{e[-1]}", *(f"-{b}..-{a}" for a, b in reversed(inner)), f"-{e[0]}..0"]
    return neg + [f"0..{e[0]}", *(f"{a}..{b}" for a, b in inner), f">={e[-1]}"]


class Record(BaseModel):
    """One training step. Fields without a default are in every stored row (None: not finite
    on the GPU, reported, never hidden); the others only where the trainer sent them."""
    # Strict: a step is a JSON integer (not true, "5" or 5.0), a number is a JSON number.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    step: Step
    loss: Finite | None
    grad_norm: Finite | None
    clip_scale: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None
    lr: NonNegative
    tokens_per_s: NonNegative | None = None
    step_ms: NonNegative | None = None
    eval_loss: Finite | None = None
    # A toy task run's exact-match accuracy on the eval's held-out problems (server/tasks.py).
    eval_acc: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    phase: Step | None = None           # the bandit phase of the step's batch (<= its step)
    # GPU time of the optimizer phase (norm, clip, AdamW), where the adapter has timestamp-query.
    opt_ms: NonNegative | None = None
    # Mean training loss per data source this step ({source index: loss}), for the bandit.
    source_losses: dict[Annotated[str, Field(pattern=r"^[0-9]{1,3}$")], Finite] | None = Field(
        default=None, max_length=64)
    # Mean training loss of each row of the batch, in batch order (None: not finite), to 7
    # significant digits: the rows far above the step's loss are its outlier candidates. As many
    # as the run's batch_size (checked against the run by the trainer socket).
    row_losses: list[NonNegative | None] | None = Field(default=None, max_length=MAX_BATCH)
    # The L2 norm of each parameter tensor's gradient before clipping (non-finite elements
    # skipped; None: not finite), in the run's parameter-table order, to 7 significant digits:
    # grad_norm is the root of their sum of squares. As many as the run's layout has tensors
    # (checked by the trainer socket).
    tensor_grad_norms: list[NonNegative | None] | None = Field(default=None,
                                                               max_length=MAX_TENSORS)
    # Non-finite gradient elements of the step, all tensors; per tensor (same order) only on
    # steps that have any, summing to the total (checked by the trainer socket).
    grad_nonfinite: Count | None = None
    tensor_nonfinite: list[Count] | None = Field(default=None, max_length=MAX_TENSORS)
    # The loss kernel's view of the batch: the largest |logit|, and the smallest softmax
    # denominator in max-subtracted form (min over rows of sum_v exp(logit_v - max_v), in
    # [1, vocab]; near 1: one token takes all of its row's probability, a collapsed softmax).
    logit_max: NonNegative | None = None
    softmax_denom_min: NonNegative | None = None
    # Mixed precision only (RunConfig.precision "mixed"; checked by the trainer socket): the loss
    # scale the step's gradients were computed under, and whether its update was skipped (a
    # non-finite gradient: weights and optimizer state untouched, the scale halved, as
    # torch.amp.GradScaler does).
    loss_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    skipped: bool | None = None
    # The model's inside, on eval steps (static/js/engine/inside_stats.js, update_probe.js): the
    # eval's held-out batch through the weights after the step. resid_rms: the RMS of the
    # residual stream where each RMSNorm reads it, one per norm gain of the parameter table, in
    # its order (each layer's input_layernorm and post_attention_layernorm, then the final norm).
    resid_rms: list[NonNegative | None] | None = Field(default=None,
                                                       max_length=2 * MAX_LAYERS + 1)
    # Per layer, its MLP's activations h = silu(gate) * up over the batch's first positions:
    # the share of its units that are dead (largest |h| below 1% of the layer's RMS h), and h
    # counted in MLP_HIST_BINS bins of |h| per sign (MLP_HIST_EDGES; negative side first).
    mlp_dead: list[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] | None = Field(
        default=None, max_length=MAX_LAYERS)
    mlp_hist: list[Annotated[list[Count], Field(min_length=MLP_HIST_BINS,
                                                max_length=MLP_HIST_BINS)]] | None = Field(
        default=None, max_length=MAX_LAYERS)
    # The step's update against the weights it changed, per parameter tensor in table order:
    # ||w_after - w_before|| / ||w_before|| (None: not finite, or a tensor of zeros).
    update_ratio: list[NonNegative | None] | None = Field(default=None, max_length=MAX_TENSORS)

    def row(self) -> dict:
        """What is stored and sent to viewers: the sent fields, plus the required ones."""
        return {k: getattr(self, k) for k in REQUIRED} | self.model_dump(exclude_none=True)


def _sql_type(prop: dict) -> str | None:
    """SQLite type of a scalar field's JSON schema; None for the rest (kept as JSON)."""
    types = {p.get("type") for p in prop.get("anyOf", [prop])} - {"null"}
    return {frozenset({"integer"}): "INTEGER", frozenset({"number"}): "REAL"}.get(frozenset(types))


class StoredRecord(Record):
    """A committed record as the API serves it: the trainer's fields and `time`."""
    time: float | None = None       # Unix seconds: when the server committed the row


_PROPS = Record.model_json_schema()["properties"]
_NUMBERS = {name: t for name, p in _PROPS.items() if (t := _sql_type(p))}
# Numeric fields in declaration order, with the server's commit `time` after the step time:
# SQLite columns and the CSV export's columns.
COLUMNS: dict[str, str] = {}
for _name, _type in _NUMBERS.items():
    COLUMNS[_name] = _type
    if _name == "step_ms":
        COLUMNS["time"] = "REAL"
SERVER_COLUMNS = ("time",)          # set by the store on commit, never sent by a trainer
REQUIRED: tuple[str, ...] = tuple(n for n, f in Record.model_fields.items() if f.is_required())
