"""The model's inside as an eval step records it (trainer.js readInside: update_probe.js and
inside_stats.js) against PyTorch on the same weights and batch: each tensor's update-to-weight
ratio against torch's AdamW + clip_grad_norm_ step from the same start (and against the engine's
own weights before and after, tightly), the residual stream's RMS at every RMSNorm's input and
each MLP's activations (histogram, dead units) against Hugging Face LlamaForCausalLM's, read
with forward hooks."""

import numpy as np
import torch

from andrea.metrics import MLP_HIST_BINS, MLP_HIST_EDGES
from andrea.model import PRESETS, build_layout
from tests import reference as ref
from tests.lab import call

STEP = """
    const {Trainer} = await import('/static/js/engine/trainer.js');
    const {parseBatch} = await import('/static/js/engine/batches.js');
    const layout = await (await fetch('/api/presets/tiny/layout')).json();
    const config = {preset: 'tiny', optimizer: 'adamw', f16_mirror: false, steps: 1,
      batch_size: 2, seq_len: 64, lr: 3e-3, min_lr_ratio: 0.1, warmup_steps: 0, beta1: 0.9,
      beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip_mode: 'global', max_norm: 0.5, seed: 0,
      data_mode: 'uniform', eval_every: 1, sample_every: 0};
    const q = 'preset=tiny&batch_size=2&steps=1';
    const body = () => fetch(`/api/batches/0?${q}`).then((r) => r.arrayBuffer());
    const records = [];
    // The eval batch is the training batch: one forward for both references.
    const trainer = await Trainer.create({ctx: lab.ctx, layout, config, loadBatch: body,
      loadValBatch: body, on: {record: (r) => records.push(r)}});
    const w0 = await trainer.model.getParams();
    await trainer.run();
    const w1 = await trainer.model.getParams();
    trainer.destroy();
    const batch = parseBatch(await body());
    return {w0, w1, rec: records[0], inputs: batch.inputs, targets: batch.targets};
"""


def hist_and_dead(h: np.ndarray) -> tuple[np.ndarray, float]:
    """inside_stats.js mlpStats's definition in NumPy: bins [e_k, e_k+1) of |h| per sign."""
    k = np.searchsorted(MLP_HIST_EDGES, np.abs(h), side="right")
    bins = np.where(h < 0, len(MLP_HIST_EDGES) - k, len(MLP_HIST_EDGES) + 1 + k)
    rms = np.sqrt(np.mean(h.astype(np.float64) ** 2))
    return (np.bincount(bins.ravel(), minlength=MLP_HIST_BINS),
            float(np.mean(np.abs(h).max(axis=0) < 0.01 * rms)))


def test_an_eval_steps_inside_matches_torch(lab_session):
    layout = build_layout(PRESETS["tiny"])
    cfg = layout["config"]
    L, F = cfg["n_layer"], cfg["ffn_dim"]
    out = call(lab_session, STEP)
    rec, w0, w1 = out["rec"], out["w0"], out["w1"]
    params = layout["params"]
    ratio = np.array(rec["update_ratio"])

    # The probe's sums against the engine's own weights before and after (f32 sums on the GPU).
    def norms(flat, p):
        return np.linalg.norm(flat[p["offset"]:p["offset"] + p["numel"]].astype(np.float64))
    own = np.array([norms(w1 - w0, p) / norms(w0, p) for p in params])
    np.testing.assert_allclose(ratio, own, rtol=2e-5)

    # The ratio against torch's step: HF's gradients, clip_grad_norm_, AdamW (decay on the
    # matrices only), from the same weights at the record's lr.
    T = 64
    tokens, targets = out["inputs"].reshape(2, T), out["targets"].reshape(2, T)
    _, grads, _ = ref.loss_and_grads(layout, w0, tokens, targets)
    w = torch.from_numpy(w0.copy()).requires_grad_()
    w.grad = torch.from_numpy(grads)
    torch.nn.utils.clip_grad_norm_([w], 0.5)
    split = layout["decay_numel"]
    decay, rest = torch.nn.Parameter(w.detach()[:split].clone()), torch.nn.Parameter(
        w.detach()[split:].clone())
    decay.grad, rest.grad = w.grad[:split].clone(), w.grad[split:].clone()
    torch.optim.AdamW([{"params": [decay], "weight_decay": 0.1},
                       {"params": [rest], "weight_decay": 0.0}],
                      lr=rec["lr"], betas=(0.9, 0.95), eps=1e-8).step()
    w_torch = torch.cat([decay.detach(), rest.detach()]).numpy()
    want = np.array([norms(w_torch - w0, p) / norms(w0, p) for p in params])
    err = float(np.max(np.abs(ratio / want - 1)))
    print(f"\nupdate/weight ratio vs torch: max rel diff {err:.2e} ({len(params)} tensors, "
          f"{want.min():.2e}..{want.max():.2e})")
    assert err < 1e-3

    # The residual stream where each norm reads it and each MLP's h, in HF, with the weights
    # after the step on the same batch.
    model = ref.hf_model(layout, w1)
    seen = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name in ("input_layernorm", "post_attention_layernorm"):
            hooks.append(getattr(layer, name).register_forward_pre_hook(
                lambda m, a, key=f"{i}.{name}": seen.__setitem__(key, a[0].detach())))
        hooks.append(layer.mlp.down_proj.register_forward_pre_hook(
            lambda m, a, key=f"{i}.h": seen.__setitem__(key, a[0].detach())))
    hooks.append(model.model.norm.register_forward_pre_hook(
        lambda m, a: seen.__setitem__("final", a[0].detach())))
    with torch.no_grad():
        model(input_ids=torch.from_numpy(tokens.astype(np.int64)))
    order = [f"{i}.{n}" for i in range(L) for n in ("input_layernorm",
                                                     "post_attention_layernorm")] + ["final"]
    want_rms = np.array([float(torch.sqrt(torch.mean(seen[k].double() ** 2))) for k in order])
    np.testing.assert_allclose(rec["resid_rms"], want_rms, rtol=1e-5)
    assert len(rec["mlp_hist"]) == len(rec["mlp_dead"]) == L
    for i in range(L):
        h = seen[f"{i}.h"].reshape(-1, F).numpy()     # every position fits the sample here
        hist, dead = hist_and_dead(h)
        got = np.array(rec["mlp_hist"][i])
        assert got.sum() == h.size
        # f32 rounding may move a value that sits on an edge to the next bin: a handful at most.
        assert np.abs(got - hist).sum() <= 4, (got, hist)
        assert abs(rec["mlp_dead"][i] - dead) <= 1 / F
