// The new-run page's clipping experiment (static/js/app/clip_experiment.js): three configs that
// differ only in clip mode, each named and tagged for it so the runs list tells them apart.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import './facts.mjs';
import { EXPERIMENT_TAG, experimentConfigs, experimentLabels } from '../../static/js/app/clip_experiment.js';

test('the three runs: one per clip mode, the bandit data, the rest the form\'s', () => {
  const configs = experimentConfigs({ preset: 'tiny', seed: 7, clip_mode: 'global', data_mode: 'uniform' });
  assert.deepEqual(configs.map((c) => [c.clip_mode, c.data_mode, c.seed]),
    [['global', 'bandit', 7], ['per_tensor', 'bandit', 7], ['off', 'bandit', 7]]);
});

test('each is named and tagged for its clip mode', () => {
  const labels = experimentConfigs({ preset: 'tiny', seed: 7 }).map(experimentLabels);
  assert.deepEqual(labels.map((l) => l.name), [
    'clip global (clip experiment, tiny, seed 7)',
    'clip per tensor (clip experiment, tiny, seed 7)',
    'no clip (clip experiment, tiny, seed 7)']);
  assert.deepEqual(labels.map((l) => l.tags), [[EXPERIMENT_TAG, 'clip-global'],
    [EXPERIMENT_TAG, 'clip-per-tensor'], [EXPERIMENT_TAG, 'clip-off']]);
  assert.equal(new Set(labels.map((l) => l.name)).size, 3);
  assert.equal(experimentLabels({ clip_mode: 'off' }).name, 'no clip (clip experiment)');
});
