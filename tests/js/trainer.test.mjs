// The learning-rate schedule (trainer.js lrAt): linear warmup, then cosine decay to a floor.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lrAt } from '../../static/js/engine/trainer.js';

const cfg = { lr: 1e-3, warmup_steps: 10, steps: 110, min_lr_ratio: 0.1 };
const close = (a, b, msg) => assert.ok(Math.abs(a - b) <= 1e-15 + 1e-12 * Math.abs(b), `${msg}: ${a} vs ${b}`);

test('warmup climbs linearly to lr', () => {
  for (let s = 0; s < 10; s++) close(lrAt(s, cfg), 1e-3 * (s + 1) / 10, `step ${s}`);
});

test('cosine decay from lr to lr * min_lr_ratio', () => {
  for (let s = 10; s < 110; s++) {
    const t = (s - 10) / 100;
    close(lrAt(s, cfg), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + Math.cos(Math.PI * t))), `step ${s}`);
  }
  close(lrAt(10, cfg), 1e-3, 'peak');
  close(lrAt(110, cfg), 1e-4, 'floor at the end');
  close(lrAt(500, cfg), 1e-4, 'floor after the end');
});

test('no warmup: the first step runs at lr', () => {
  close(lrAt(0, { ...cfg, warmup_steps: 0 }), 1e-3, 'first step');
  close(lrAt(109, { ...cfg, warmup_steps: 0 }), 1e-3 * (0.1 + 0.45 * (1 + Math.cos(Math.PI * 109 / 110))), 'last step');
});
