// Attention on the matrix units (mma_attention.js, chosen by kernels.js for mixed runs): which
// shapes it takes, the workgroup memory it needs, and the WGSL it generates. Its results are held
// against torch on a GPU with f16 subgroup matrices (tests/unit/gpu/test_mixed_kernels.py;
// bench/bench_attention_mma.mjs); SwiftShader has none.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  attentionDkdvShader, attentionDqFromDsShader, attentionDqShader, attentionForwardShader,
  mmaAttentionBytes, mmaAttentionFits,
} from '../../static/js/engine/mma_attention.js';

test('mma attention: whole 64-row blocks and head dims of 16 .. 64 in steps of 16', () => {
  assert.ok(mmaAttentionFits(1024, 64));    // 120m
  assert.ok(mmaAttentionFits(256, 64));     // 12m
  assert.ok(mmaAttentionFits(64, 16));      // tiny
  assert.ok(!mmaAttentionFits(32, 16));     // the tests' small model: rows of 32, fp32 kernels
  assert.ok(!mmaAttentionFits(100, 64));
  assert.ok(!mmaAttentionFits(256, 128));   // wider heads keep the fp32 kernels
  assert.ok(!mmaAttentionFits(256, 40));
});

test('mma attention: every kernel fits 48 KiB of workgroup memory', () => {
  for (const D of [16, 32, 48, 64]) {
    for (const [name, bytes] of Object.entries(mmaAttentionBytes(D))) {
      assert.ok(bytes <= 49152, `D ${D} ${name}: ${bytes} B`);
    }
  }
});

test('mma attention: the generated WGSL declares what its launcher binds and what it sized', () => {
  for (const D of [16, 64]) {
    for (const syntax of ['template', 'bool']) {
      const shaders = {
        forward: [attentionForwardShader(D, syntax), ['qkv', 'y', 'lse']],
        dq: [attentionDqShader(D, syntax), ['qkv', 'dy', 'lse', 'delta', 'dqkv']],
        dkdv: [attentionDkdvShader(D, syntax), ['qkv', 'dy', 'lse', 'delta', 'dqkv']],
        dkdvDs: [attentionDkdvShader(D, syntax, true), ['qkv', 'dy', 'lse', 'delta', 'dqkv', 'ds']],
        dqFromDs: [attentionDqFromDsShader(D, syntax), ['qkv', 'ds', 'dqkv']],
      };
      for (const [name, [code, names]] of Object.entries(shaders)) {
        assert.doesNotMatch(code, /undefined|NaN|\$\{/, `${name} D${D}`);
        const bound = [...code.matchAll(/@binding\((\d+)\) var<[^>]+> (\w+)/g)].map((m) => m[2]);
        assert.deepEqual(bound, ['dims', ...names], `${name} D${D}`);
        assert.match(code, /@compute @workgroup_size\(128\)/);
        // the template spelling (current) or the bool one (first Chromium releases)
        assert.equal(code.includes('row_major>('), syntax === 'template', `${name} D${D}`);
      }
      // workgroup arrays add up to the bytes the support check uses
      const bytes = (code) => [...code.matchAll(/var<workgroup> \w+: array<(f16|f32), (\d+)>/g)]
        .reduce((a, m) => a + (m[1] === 'f16' ? 2 : 4) * Number(m[2]), 0);
      const want = mmaAttentionBytes(D);
      assert.equal(bytes(shaders.forward[0]), want.forward);
      assert.equal(bytes(shaders.dq[0]), want.dq);
      assert.equal(bytes(shaders.dkdv[0]), want.dkdv);
      assert.ok(bytes(shaders.dqFromDs[0]) <= want.dq);
    }
  }
});
