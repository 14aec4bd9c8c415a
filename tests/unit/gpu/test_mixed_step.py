"""A whole mixed-precision training step against the Hugging Face model: the engine's Trainer
(f16 subgroup-matrix linears, dynamic loss scaling) runs one step of a run whose every matmul fills
the mixed kernel's tiles, and its record's loss and per-tensor gradient norms (after unscaling)
are compared with LlamaForCausalLM on the same weights and batch, in fp32 and under
torch.autocast(dtype=torch.float16).

Autocast rounds each matmul's operands to f16, as the engine does, and also its output (the
engine keeps f32 outputs): so the engine's step must be at least about as close to the fp32 step
as autocast's is (within twice autocast's distance, loss and every tensor's gradient norm). A
lost loss scale, an unscaled gradient or a wrong operand layout is off by orders of magnitude.

Runs wherever the lab's adapter has f16 subgroup matrices (lab.info.mixed): on an H200 with
ANDREA_GPU_BROWSER=1; SwiftShader has none, so CI skips it.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from andrea.data import wire
from tests import reference as ref
from tests.lab import call

# tiny's vocabulary and context with a width, heads and FFN whose matmuls fill 128 x 128 x 32;
# and tiny itself, whose matmuls take the smaller tiles (mma_ops.js mmaTile).
RUN = {"batch_size": 2, "steps": 1, "precision": "mixed", "eval_every": 0, "sample_every": 0}
SHAPES = {"engine_tile": {"preset": "tiny", "n_embd": 128, "n_head": 2, "ffn_dim": 256},
          "tiny": {"preset": "tiny"}}

STEP = """
    const {Trainer} = await import('/static/js/engine/trainer.js');
    const maps = await (await fetch('/api/optimizer/maps')).json();
    const records = [];
    const batch = (s) => fetch(`/api/runs/${args.id}/batches/${s}`).then((r) => r.arrayBuffer());
    const trainer = await Trainer.create({ctx: lab.ctx, layout: args.layout, config: args.config,
      maps, loadBatch: batch, on: {record: (r) => records.push(r)}});
    const w = await trainer.model.getParams();
    const state = await trainer.run();
    trainer.destroy();
    return {state, w, rec: records[0]};
"""


def norms(layout, grads):
    return np.array([np.linalg.norm(grads[p["offset"]:p["offset"] + p["numel"]].astype(np.float64))
                     for p in layout["params"]])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("f16_mirror", [False, True])   # weights from the f16 mirror, or rounded
def test_a_mixed_step_is_as_close_to_fp32_as_torch_autocast(lab_session, live_server, f16_mirror,
                                                            shape):
    mixed = call(lab_session, "return lab.info.mixed;")
    if not mixed["ok"]:
        pytest.skip(f"no f16 subgroup matrices here: {mixed['why']}")
    run = httpx.post(f"{live_server}/api/runs",
                     json={**SHAPES[shape], **RUN, "f16_mirror": f16_mirror}).json()
    layout = run["layout"]
    out = call(lab_session, STEP, {"layout": layout, "config": run["config"], "id": run["id"]})
    assert out["state"] == "finished"
    rec, w = out["rec"], np.asarray(out["w"], dtype=np.float32)
    assert rec["loss_scale"] == 65536 and rec["skipped"] is False
    tokens = wire.decode(httpx.get(f"{live_server}/api/runs/{run['id']}/batches/0").content)
    tokens = tokens.tokens.astype(np.int64)
    loss32, g32, _ = ref.loss_and_grads(layout, w, tokens[:, :-1], tokens[:, 1:])
    with torch.autocast("cpu", dtype=torch.float16):
        loss16, g16, _ = ref.loss_and_grads(layout, w, tokens[:, :-1], tokens[:, 1:])
    n32, n16 = norms(layout, g32), norms(layout, g16)
    ours = np.array(rec["tensor_grad_norms"], dtype=np.float64)
    d_ours, d_auto = np.abs(ours - n32) / n32, np.abs(n16 - n32) / n32
    print(f"\nloss fp32 {loss32:.6f} autocast {loss16:.6f} engine mixed {rec['loss']:.6f}; "
          f"tensor grad norms vs fp32: autocast max {d_auto.max():.2e}, engine {d_ours.max():.2e}")
    assert abs(rec["loss"] - loss32) <= 2 * abs(loss16 - loss32) + 1e-6
    worst = 2 * d_auto.max()
    assert d_ours.max() <= worst, [(p["name"], a, b) for p, a, b
                                   in zip(layout["params"], d_ours, d_auto) if a > worst]
