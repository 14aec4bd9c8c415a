"""What a metrics message's records must fit that the Record model alone cannot say: the run's
own sizes. Per-row losses have one number per row of the run's batch; per-tensor gradient
numbers one per tensor of its parameter table; per-tensor non-finite counts come only with a
step's non-finite total and add up to it. Checked before anything of the message is committed
(1003 otherwise, naming the field and the step)."""

from __future__ import annotations

from andrea.errors import INVALID
from andrea.metrics import Record
from andrea.run_config import StoredRunConfig, run_layout
from andrea.telemetry.protocol import ProtocolError

NOTHING_STORED = "Nothing of this message was stored"


def tensor_count(config: StoredRunConfig) -> int:
    """The parameter tensors of a run's model: what its per-tensor lists hold one entry for."""
    return len(run_layout(config)["params"])


def layer_count(config: StoredRunConfig) -> int:
    """The layers of a run's model: what its per-layer lists (mlp_dead, mlp_hist) hold one entry
    for; resid_rms has one per norm gain, two a layer and the final norm's."""
    return config.n_layer


def check_inside(n_layer: int, records: list[Record]) -> None:
    """resid_rms has 2 n_layer + 1 numbers, mlp_dead and mlp_hist one entry per layer."""
    sizes = {"resid_rms": (2 * n_layer + 1, "one per RMSNorm: two a layer and the final norm"),
             "mlp_dead": (n_layer, "one per layer"), "mlp_hist": (n_layer, "one per layer")}
    for r in records:
        for field, (want, words) in sizes.items():
            values = getattr(r, field)
            if values is not None and len(values) != want:
                raise ProtocolError(INVALID, f"{field} of step {r.step}: {len(values)} entries for"
                                             f" a model of {n_layer} layers; give {want}, {words}. "
                                             + NOTHING_STORED)


def check_rows(batch_size: int, records: list[Record]) -> None:
    """row_losses, where sent, has one number per row of the run's batch."""
    for r in records:
        if r.row_losses is not None and len(r.row_losses) != batch_size:
            raise ProtocolError(INVALID, f"row_losses of step {r.step}: {len(r.row_losses)} numbers"
                                         f" for a batch of {batch_size} rows; give one per row. "
                                         + NOTHING_STORED)


def check_precision(precision: str, records: list[Record]) -> None:
    """loss_scale and skipped come together, and from mixed-precision runs only."""
    for r in records:
        sent = (r.loss_scale is not None, r.skipped is not None)
        if sent == (False, False):
            continue
        if sent != (True, True):
            raise ProtocolError(INVALID, f"loss_scale and skipped of step {r.step}: send both or "
                                         "neither. " + NOTHING_STORED)
        if precision != "mixed":
            raise ProtocolError(INVALID, f"loss_scale of step {r.step}: the run trains in "
                                         f"{precision}; only a mixed-precision run has a loss "
                                         "scale. " + NOTHING_STORED)


def check_tensors(n_tensors: int, records: list[Record]) -> None:
    """tensor_grad_norms, tensor_nonfinite and update_ratio, where sent, have one entry per
    parameter tensor
    (GET /api/runs/{id}/layout's params, in order); tensor_nonfinite only on a step whose
    grad_nonfinite is above 0, and summing to it."""
    for r in records:
        for field in ("tensor_grad_norms", "tensor_nonfinite", "update_ratio"):
            values = getattr(r, field)
            if values is not None and len(values) != n_tensors:
                raise ProtocolError(INVALID, f"{field} of step {r.step}: {len(values)} entries for"
                                             f" a model of {n_tensors} parameter tensors; give one"
                                             " per tensor of the run's layout, in its order. "
                                             + NOTHING_STORED)
        if r.tensor_nonfinite is None:
            continue
        if not r.grad_nonfinite:
            raise ProtocolError(INVALID, f"tensor_nonfinite of step {r.step}: sent without a "
                                         "grad_nonfinite above 0; send it only on steps with "
                                         "non-finite gradient elements. " + NOTHING_STORED)
        if sum(r.tensor_nonfinite) != r.grad_nonfinite:
            raise ProtocolError(INVALID, f"tensor_nonfinite of step {r.step}: adds up to "
                                         f"{sum(r.tensor_nonfinite)}, not to its grad_nonfinite "
                                         f"{r.grad_nonfinite}. " + NOTHING_STORED)
