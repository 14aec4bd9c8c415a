// Why mixed precision cannot run here (app/mixed_note.js): a software adapter is told no flag
// helps; a GPU is told only the flags for the features its adapter lacks.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import './facts.mjs';
import { mixedMissing, precisionNote } from '../../static/js/app/mixed_note.js';

const gpu = (...features) => ({ software: false, info: { vendor: 'nvidia', architecture: 'hopper' },
  adapter: { features: new Set(features) } });

test('mixed note: a software adapter never has them, so no flag is suggested', () => {
  const ctx = { software: true, info: { vendor: 'google', architecture: 'swiftshader' },
    adapter: { features: new Set() } };
  const text = mixedMissing('No shader-f16.', ctx, 'choose fp32');
  assert.match(text, /software one \(google swiftshader\): no shader-f16\. A software adapter never/);
  assert.match(text, /choose fp32, or use a browser on a GPU$/);
  assert.doesNotMatch(text, /--enable/);
});

test('mixed note: a GPU is told the flags for what its adapter lacks, and only those', () => {
  const none = mixedMissing('no shader-f16', gpu(), 'choose fp32');
  assert.match(none, /--enable-unsafe-webgpu; on NVIDIA also --enable-dawn-features=/);
  const f16 = mixedMissing('no subgroup matrices', gpu('shader-f16'), 'choose fp32');
  assert.match(f16, /with --enable-unsafe-webgpu$/);
  assert.doesNotMatch(f16, /dawn-features/);
  const matrices = mixedMissing('no shader-f16', gpu('chromium-experimental-subgroup-matrix'), 'x');
  assert.match(matrices, /on NVIDIA with --enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16/);
  assert.doesNotMatch(matrices, /unsafe-webgpu/);
});

test('mixed note: an adapter with both features but not the kernel\'s needs gets no flag', () => {
  const text = mixedMissing('Subgroups of 64 lanes', gpu('shader-f16',
    'chromium-experimental-subgroup-matrix'), 'train with precision fp32 (a new run)');
  assert.equal(text, 'this GPU\'s adapter has the features but not what the engine\'s kernel ' +
    'needs: subgroups of 64 lanes. Train with precision fp32 (a new run)');
});

test('mixed note: with no adapter at all, both the GPU flags and the software rule are said', () => {
  const text = mixedMissing('no WebGPU here', null, 'choose fp32');
  assert.match(text, /On a GPU, Chrome offers them with --enable-unsafe-webgpu; on NVIDIA also/);
  assert.match(text, /a software adapter never has them$/);
});

test('precision note: where mixed is offered, it is spoken of only while mixed is chosen', () => {
  const ctx = gpu('shader-f16', 'chromium-experimental-subgroup-matrix');
  // An fp32 run (the form's default) uses no matrix units: no note says mixed runs its matmuls.
  assert.equal(precisionNote({ ok: true, why: null }, ctx, 'fp32'), '');
  assert.equal(precisionNote({ ok: true, why: null }, ctx, 'mixed'),
    'This GPU has f16 matrix units for WGSL: mixed precision runs its matmuls there.');
});

test('precision note: where mixed is not offered, it says why its option is disabled', () => {
  const note = precisionNote({ ok: false, why: 'no shader-f16' }, gpu(), 'fp32');
  assert.match(note, /^Mixed precision needs f16 subgroup matrices \(WGSL's matrix units\), and this /);
  assert.equal(note, `Mixed precision needs f16 subgroup matrices (WGSL's matrix units), and ${
    mixedMissing('no shader-f16', gpu(), 'choose fp32')}.`);
});
