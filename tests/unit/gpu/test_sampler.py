"""Text samples: generating over a short window gives exactly the ids of the full context
window (causal attention), so the page's samples cost a fraction of a full [1, T] forward."""

from tests.lab import call


def test_a_short_window_samples_the_same_ids_as_the_full_context(lab_session):
    got = call(lab_session, """
      const { generate } = await import('/static/js/engine/sampler.js');
      const model = await lab.createModel({preset: 'tiny', seed: 3});
      const prompt = [5, 17, 99, 3, 250, 7, 8, 1];
      const full = await generate(model, prompt, 24, {seed: 11, window: model.config.seq_len});
      const short = await generate(model, prompt, 24, {seed: 11});            // [1, 64] window
      const greedy = await generate(model, prompt, 24, {temperature: 0, window: 40});
      const greedyFull = await generate(model, prompt, 24, {temperature: 0,
        window: model.config.seq_len});
      model.destroy();
      return {full, short, greedy, greedyFull};
    """)
    assert len(got["full"]) == 24 and got["short"] == got["full"]
    assert got["greedy"] == got["greedyFull"]
    assert len(set(got["full"])) > 1          # a model that always says the same is no test
