// The server's facts as the pages get them (server/page_facts.py), against what the engine does
// with them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FACTS } from './facts.mjs';
import { CLIP_MODES, HYPER_KEYS, mergeHyper } from '../../static/js/engine/optimizer_hyper.js';

test('the optimizer kernels run every clip mode the server offers', () => {
  assert.deepEqual(Object.keys(FACTS.clip_modes).sort(), Object.keys(CLIP_MODES).sort());
});

test('the server\'s defaults are a whole hyper; the engine refuses one with a value missing', () => {
  assert.deepEqual(Object.keys(FACTS.optimizer_defaults).sort(), [...HYPER_KEYS].sort());
  assert.deepEqual(mergeHyper({}, FACTS.optimizer_defaults), FACTS.optimizer_defaults);
  const { eps, ...rest } = FACTS.optimizer_defaults;
  assert.ok(eps > 0);
  assert.throws(() => mergeHyper({}, rest), /no eps given/);
  assert.equal(mergeHyper({}, { ...FACTS.optimizer_defaults, clip_mode: undefined, clip: false }).clip_mode, 'off');
});
