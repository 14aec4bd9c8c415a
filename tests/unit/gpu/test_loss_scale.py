"""Mixed precision's dynamic loss scaling (12_optimizer.wgsl: unscale_grads, the skip of a step
with a non-finite gradient, update_loss_scale) through the lab page (Chromium + SwiftShader)
against torch.amp.GradScaler with torch.optim.AdamW and clip_grad_norm_ on the CPU.

The gradients fed to the engine are what a backward under the scale makes: the true gradient times
the scale GradScaler holds at that step, with NaN and Inf planted on two steps. Adam's bias
corrections count the applied steps only, as torch's AdamW does under GradScaler (a skipped step is
no optimizer step): the engine keeps that count on the GPU (12_optimizer.wgsl bias_correct), since
the host sets a step's hyperparameters before the GPU decides its skip.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.unit.gpu.test_optimizer import (
    B1,
    B2,
    EPS,
    LR,
    MAX_NORM,
    WD,
    flatten,
    report,
    run_steps,
    tensors,
)

INIT, GROWTH = 1024.0, 3
BAD = {3: np.inf, 6: np.nan}   # steps whose gradient gets a non-finite element


def scaled_run(layout, w0, grads):
    """torch with GradScaler; returns (params, the gradients the engine is fed, scale per step,
    skipped per step, final scale, the steps AdamW applied: its state's `step`)."""
    ps = [torch.nn.Parameter(t) for t in tensors(layout, w0)]
    decay = [q for q, p in zip(ps, layout["params"]) if p["decay"]]
    no_decay = [q for q, p in zip(ps, layout["params"]) if not p["decay"]]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(B1, B2), eps=EPS, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT, growth_interval=GROWTH)
    fed, scales, skipped = [], [], []
    for s, g in enumerate(grads):
        scaler.scale(torch.ones(()))   # what scaler.scale(loss) does first: its state, on the CPU
        scale = scaler.get_scale()
        G = (g * np.float32(scale)).astype(np.float32)
        if s in BAD:
            G[layout["params"][1]["offset"] + 5] = BAD[s]
        fed.append(G)
        for q, t in zip(ps, tensors(layout, G)):
            q.grad = t.clone()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(ps, MAX_NORM)
        scaler.step(opt)
        scaler.update()
        scales.append(scale)
        skipped.append(s in BAD)
    return (ps, fed, np.array(scales), np.array(skipped), scaler.get_scale(),
            int(opt.state[ps[0]]["step"]))


def test_dynamic_loss_scaling_matches_grad_scaler(lab_session, layout, problem):
    w0, grads = problem
    ps, fed, scales, skipped, final, steps = scaled_run(layout, w0, grads)
    assert skipped.any() and (scales != scales[0]).any(), "the test should skip and grow"
    out = run_steps(lab_session, layout, w0, fed, lossScale={"init": INIT, "growth": GROWTH})
    np.testing.assert_array_equal(out["loss_scales"], scales)
    np.testing.assert_array_equal(out["skipped"] > 0, skipped)
    assert out["scaler"][0] == final
    applied = len(grads) - skipped.sum()
    assert out["scaler"][2] == applied == steps, "the applied steps Adam counted"
    dw = np.abs(out["params"] - flatten(layout, ps))
    print(report("fp32 AdamW + loss scaling vs torch GradScaler, w", dw))
    assert dw.max() <= 1e-6, report("w", dw)
    assert not out["grads"].any(), "G must be zeroed, skipped step or not"


def test_a_skipped_step_leaves_weights_and_state_alone(lab_session, layout, problem):
    """A step whose gradient has an Inf changes nothing but the scale (halved) and G (zeroed),
    for the fp32 and the 8-bit update alike."""
    w0, grads = problem
    bad = (grads[0] * np.float32(INIT)).astype(np.float32)
    bad[layout["params"][0]["offset"] + 1] = np.inf
    for variant in ("adamw", "adamw_8bit"):
        first = run_steps(lab_session, layout, w0, [grads[0] * np.float32(INIT)], variant=variant,
                          lossScale={"init": INIT, "growth": GROWTH})
        both = run_steps(lab_session, layout, w0, [grads[0] * np.float32(INIT), bad],
                         variant=variant, lossScale={"init": INIT, "growth": GROWTH})
        np.testing.assert_array_equal(both["params"], first["params"], err_msg=variant)
        for k in first["state"]:
            if isinstance(first["state"][k], np.ndarray):
                np.testing.assert_array_equal(both["state"][k], first["state"][k], err_msg=variant)
        np.testing.assert_array_equal(both["skipped"], [0, 1])
        assert both["scaler"][0] == INIT / 2 and both["scaler"][1] == 0
        assert both["scaler"][2] == 1         # one applied step: the next one's Adam t is 2
        assert not both["grads"].any()
