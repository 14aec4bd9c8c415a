"""GPU memory lifetimes: everything the engine allocates is freed by its owner's destroy().
The context (static/js/engine/context.js) counts live buffers and their bytes; build/destroy
cycles of a model, an optimizer and a trainer that trains, evaluates and samples must leave
the count where it started."""

from tests.lab import call

CYCLES = """
    const {Trainer} = await import('/static/js/engine/trainer.js');
    const {Optimizer} = await import('/static/js/engine/optimizer.js');
    const ctx = lab.ctx;
    const layout = await (await fetch('/api/presets/tiny/layout')).json();
    const maps = await (await fetch('/api/optimizer/maps')).json();
    const count = () => [ctx.allocatedBytes, ctx.liveBuffers];
    const q = 'preset=tiny&batch_size=2&steps=3';
    const before = count();
    const during = [];
    const after = [];
    for (let i = 0; i < 3; i++) {
      const variant = ['adamw', 'adamw_8bit', 'adamw_f16'][i];
      // A model with a plan, and an optimizer over it.
      const model = await lab.createModel({layout, seed: i});
      const tokens = Uint32Array.from({length: 128}, (_, j) => (j * 7 + i) % 512);
      await model.lossAndGrads(tokens, tokens, 2, 64);
      await model.logits(tokens.subarray(0, 64), 1, 64);          // a second plan
      const opt = await Optimizer.create(ctx, layout, {variant: variant + '_f16'.repeat(i === 1),
        W: model.W, G: model.G, maps, hyper: ctx.optimizerDefaults});
      during.push(count());
      opt.destroy();
      model.destroy();
      // A trainer that trains, evaluates and samples (the sampler's [1, T] plan), then ends.
      const config = {preset: 'tiny', optimizer: variant.replace('_f16', ''),
        f16_mirror: variant.endsWith('_f16'), steps: 3, batch_size: 2, seq_len: 64, lr: 1e-3,
        min_lr_ratio: 0.1, warmup_steps: 1, beta1: 0.9, beta2: 0.95, eps: 1e-8,
        weight_decay: 0.1, clip_mode: 'global', max_norm: 1.0, seed: i, data_mode: 'uniform',
        eval_every: 2, sample_every: 2};
      const trainer = await Trainer.create({ctx, layout, config, maps,
        loadBatch: (s) => fetch(`/api/batches/${s}?${q}`).then((r) => r.arrayBuffer()),
        loadValBatch: (k) => fetch(`/api/val_batches/${k}?${q}`).then((r) => r.arrayBuffer())});
      const state = await trainer.run();
      if (state !== 'finished') throw new Error(`trainer ended ${state}`);
      trainer.destroy();
      after.push(count());
    }
    return {before, during, after};
"""


def test_build_destroy_cycles_leave_no_gpu_buffers(lab_session):
    out = call(lab_session, CYCLES)
    before = out["before"]
    for bytes_, buffers in out["during"]:
        # tiny: W and G alone are 2 x 139,584 floats; counting works
        assert bytes_ - before[0] > 2 * 139_584 * 4 and buffers > before[1]
    assert out["after"] == [before] * 3, out
