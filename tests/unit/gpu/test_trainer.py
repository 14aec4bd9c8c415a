"""The trainer in the page with real batches from the server: LR schedule, non-finite loss
handling, pause/resume/stop."""

import math

import pytest

from andrea.model import PRESETS, build_layout
from tests.lab import call

SETUP = """
    const {Trainer} = await import('/static/js/engine/trainer.js');
    const layout = await (await fetch('/api/presets/tiny/layout')).json();
    const maps = await (await fetch('/api/optimizer/maps')).json();
    const config = {preset: 'tiny', optimizer: 'adamw', f16_mirror: false, steps: args.steps,
      batch_size: 2, seq_len: 64, lr: 3e-3, min_lr_ratio: 0.1, warmup_steps: 2, beta1: 0.9,
      beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip_mode: 'global', max_norm: 1.0, seed: 0,
      data_mode: 'uniform', eval_every: 0, sample_every: 0};
    const q = `preset=tiny&batch_size=2&steps=${args.steps}`;
    const records = [], statuses = [];
    const trainer = await Trainer.create({ctx: lab.ctx, layout, config, maps,
      loadBatch: (s) => fetch(`/api/batches/${s}?${q}`).then((r) => r.arrayBuffer()),
      on: {record: (r) => records.push(r), status: (s, m) => statuses.push([s, m])}});
"""


def test_lr_schedule(lab_session):
    cfg = {"lr": 1e-3, "warmup_steps": 10, "steps": 110, "min_lr_ratio": 0.1}
    out = call(lab_session, """
        const {lrAt} = await import('/static/js/engine/schedule.js');
        return {lrs: Array.from({length: 110}, (_, s) => lrAt(s, args.cfg))};
    """, {"cfg": cfg})
    lrs = out["lrs"]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    for s in range(10, 110):
        t = (s - 10) / 100
        assert lrs[s] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_non_finite_loss_is_reported_and_stops_the_run(lab_session):
    wte = next(p for p in build_layout(PRESETS["tiny"])["params"]
               if p["name"] == "model.embed_tokens.weight")
    out = call(lab_session, SETUP + """
        const w = await trainer.model.getParams();
        w.fill(NaN, args.offset, args.offset + args.numel);   // poison the embedding
        trainer.model.setParams(w);
        const state = await trainer.run();
        trainer.destroy();
        return {state, records, statuses};
    """, {"steps": 20, "offset": wte["offset"], "numel": wte["numel"]})
    assert out["state"] == "failed"
    assert out["records"][0]["loss"] is None          # reported as non-finite, not hidden
    assert len(out["records"]) < 20                    # and the run stopped
    assert out["statuses"][-1][0] == "failed" and "non-finite" in out["statuses"][-1][1]


def test_pause_resume_stop(lab_session):
    out = call(lab_session, SETUP + """
        const done = trainer.run();
        while (records.length < 2) await new Promise((r) => setTimeout(r, 20));
        trainer.pause();
        while (statuses.length < 2) await new Promise((r) => setTimeout(r, 20));
        const atPause = records.length;          // 'paused' comes once the steps in flight landed
        await new Promise((r) => setTimeout(r, 1500));
        const whilePaused = records.length;
        trainer.resume();
        while (records.length < whilePaused + 2) await new Promise((r) => setTimeout(r, 20));
        trainer.stop();
        const state = await done;
        trainer.destroy();
        return {atPause, whilePaused, total: records.length, state,
                statuses: statuses.map((s) => s[0]),
                steps: records.map((r) => r.step), stats: trainer.stats};
    """, {"steps": 200})
    assert out["whilePaused"] == out["atPause"], "no step ran while paused"
    assert out["state"] == "stopped" and out["total"] < 200
    assert out["steps"] == list(range(1, out["total"] + 1))
    assert out["statuses"] == ["running", "paused", "running", "stopped"]


def test_loop_profile_accounts_for_every_step(lab_session):
    """stats.loop (where the loop's time goes; bench/bench_trainer.mjs prints it) counts every
    step once, with finite non-negative times; with timestamp-query, every step's GPU time."""
    out = call(lab_session, SETUP + """
        const state = await trainer.run();
        trainer.destroy();
        JSON.stringify(trainer.stats);   // the page and the headless CLI serialize it
        const loop = trainer.stats.loop;
        return {state, loop, n: records.length, submitted: trainer.stats.submitted,
                timestamps: lab.ctx.device.features.has('timestamp-query'),
                opt: records.map((r) => r.opt_ms ?? null)};
    """, {"steps": 6})
    loop = out["loop"]
    assert out["state"] == "finished" and out["n"] == out["submitted"] == 6
    assert loop["steps"] == 6
    assert all(math.isfinite(v) and v >= 0 for v in loop.values()), loop
    assert loop["encodeMs"] > 0 and loop["mapMs"] > 0
    if out["timestamps"]:
        assert loop["gpuSteps"] == 6 and loop["gpuBusyMs"] > 0
        assert all(x is not None and x > 0 for x in out["opt"])
    else:
        assert loop["gpuSteps"] == 0 and loop["gpuBusyMs"] == 0


def first_step(page, server):
    """A one-step run: (its record, the weights it ran with f32 [total_numel], its batch's
    tokens int64 [B, T + 1], the tiny layout)."""
    import httpx
    import numpy as np

    from andrea.data import wire

    out = call(page, SETUP + """
        const w = await trainer.model.getParams();   // the weights step 1 runs with
        const state = await trainer.run();
        trainer.destroy();
        return {state, w, rec: records[0]};
    """, {"steps": 1})
    assert out["state"] == "finished"
    batch = wire.decode(httpx.get(f"{server}/api/batches/0",
                                  params={"preset": "tiny", "batch_size": 2, "steps": 1}).content)
    layout = httpx.get(f"{server}/api/presets/tiny/layout").json()
    return (out["rec"], np.asarray(out["w"], dtype=np.float32), batch.tokens.astype(np.int64),
            layout)


def test_row_losses_are_each_rows_mean_cross_entropy_as_torch_computes_it(lab_session, live_server):
    """The record's row_losses: the mean token cross-entropy of each row of the step's batch, as
    torch's cross_entropy(reduction='none') averaged per row gives it for the same weights (the
    Hugging Face model) and batch; their mean is the step's loss."""
    import numpy as np
    import torch

    from tests import reference as ref

    rec, w, tokens, layout = first_step(lab_session, live_server)
    with torch.no_grad():
        logits = ref.hf_model(layout, w)(input_ids=torch.from_numpy(tokens[:, :-1])).logits
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.from_numpy(tokens[:, 1:]).reshape(-1),
            reduction="none").reshape(tokens.shape[0], -1)
    want = per_token.mean(dim=1).numpy()
    got = np.array(rec["row_losses"], dtype=np.float64)
    print(f"\nrow losses {got} vs torch {want}")
    assert got.shape == (2,)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.mean(got) == pytest.approx(rec["loss"], rel=1e-5)


def test_tensor_grad_norms_and_logit_stats_match_the_hugging_face_model(lab_session, live_server):
    """The record's tensor_grad_norms: torch.linalg.vector_norm of each parameter's gradient in
    LlamaForCausalLM for the same weights and batch (within the gradient parity's 1e-4 x the
    largest), in parameter-table order, their squares summing to grad_norm's to f32 rounding;
    logit_max and softmax_denom_min: max |logit| and the smallest max-subtracted softmax
    denominator of torch's logits; no non-finite gradient elements."""
    import numpy as np
    import torch

    from tests import reference as ref

    rec, w, tokens, layout = first_step(lab_session, live_server)
    _, grads, logits = ref.loss_and_grads(layout, w, tokens[:, :-1], tokens[:, 1:])
    want = np.array([np.linalg.norm(grads[p["offset"]:p["offset"] + p["numel"]].astype(np.float64))
                     for p in layout["params"]])
    got = np.array(rec["tensor_grad_norms"], dtype=np.float64)
    assert got.shape == (len(layout["params"]),)
    for p, g, t in zip(layout["params"], got, want):
        assert abs(g - t) <= 1e-4 * want.max(), f"{p['name']}: {g} vs torch {t}"
    print(f"\ntensor grad norms: max rel err {np.max(np.abs(got - want) / want):.2e}")
    assert math.sqrt(np.sum(got ** 2)) == pytest.approx(rec["grad_norm"], rel=2e-6)
    assert rec["grad_nonfinite"] == 0 and "tensor_nonfinite" not in rec
    x = torch.from_numpy(logits.reshape(-1, logits.shape[-1]))
    assert rec["logit_max"] == pytest.approx(float(x.abs().max()), rel=1e-5)
    denom = torch.exp(x - x.amax(dim=1, keepdim=True)).sum(dim=1)
    assert rec["softmax_denom_min"] == pytest.approx(float(denom.min()), rel=1e-5)
