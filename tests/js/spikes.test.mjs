// The run page's spike count in words (app/spikes.js spikeTally): a finished run's spikes are
// all it will have, so its page counts them "in all", not "so far"; a run that may still train
// (running, or stopped, interrupted or failed and so resumable) counts them "so far".
import assert from 'node:assert/strict';
import { test } from 'node:test';
import './facts.mjs';
import { spikeTally } from '../../static/js/app/spikes.js';

test('spike count: a finished run has its spikes in all, not so far', () => {
  assert.deepEqual(spikeTally(2, 'finished'), { count: '2 in all.', empty: 'No spikes in this run.' });
  assert.equal(spikeTally(0, 'finished').empty, 'No spikes in this run.');
});

test('spike count: a run that may still train has them so far', () => {
  for (const status of ['running', 'paused', 'stopped', 'interrupted', 'failed', 'created']) {
    assert.deepEqual(spikeTally(2, status), { count: '2 so far.', empty: 'No spikes yet.' }, status);
  }
});
