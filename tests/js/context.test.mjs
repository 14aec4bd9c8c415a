// The engine context (context.js) over a stand-in GPU: what it requests, and its buffer count.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createContext } from '../../static/js/engine/context.js';

function fakeGpu({ features = ['timestamp-query', 'shader-f16'], description = 'SwiftShader' } = {}) {
  const requested = {};
  const device = {
    features: null, limits: null,
    createBuffer: (desc) => ({ size: desc.size, destroyed: 0, destroy() { this.destroyed += 1; } }),
    addEventListener: () => {},
    lost: new Promise(() => {}),
    destroy: () => { requested.deviceDestroyed = true; },
  };
  const adapter = {
    features: new Set(features),
    limits: { maxStorageBufferBindingSize: 2 ** 27, maxBufferSize: 2 ** 28 },
    info: { vendor: 'google', architecture: '', device: '', description },
    requestDevice: async ({ requiredFeatures, requiredLimits }) => {
      Object.assign(requested, { requiredFeatures, requiredLimits });
      device.features = new Set(requiredFeatures);
      device.limits = requiredLimits;
      return device;
    },
  };
  return { gpu: { requestAdapter: async () => adapter }, requested };
}

test('context: adapter facts, the shader library, only the features the engine uses', async () => {
  const { gpu, requested } = fakeGpu();
  const ctx = await createContext({ gpu, load: async () => '' });
  assert.deepEqual(requested.requiredFeatures, ['timestamp-query']);
  assert.equal(requested.requiredLimits.maxStorageBufferBindingSize, 2 ** 27);
  assert.equal(ctx.software, true);
  assert.equal(ctx.limits.maxBufferSize, 2 ** 28);
  assert.equal(typeof ctx.lib.pipeline, 'function');
  ctx.destroy();
  assert.equal(requested.deviceDestroyed, true);
});

test('context counts buffers from createBuffer to their (first) destroy', async () => {
  const { gpu } = fakeGpu({ description: 'NVIDIA H200' });
  const ctx = await createContext({ gpu, load: async () => '' });
  assert.equal(ctx.software, false);
  const a = ctx.device.createBuffer({ size: 1024 });
  const b = ctx.device.createBuffer({ size: 16 });
  assert.deepEqual([ctx.allocatedBytes, ctx.liveBuffers], [1040, 2]);
  a.destroy();
  a.destroy();   // a second destroy is legal WebGPU and must not count twice
  assert.deepEqual([ctx.allocatedBytes, ctx.liveBuffers], [16, 1]);
  assert.equal(a.destroyed, 2);   // the real destroy still ran
  b.destroy();
  assert.deepEqual([ctx.allocatedBytes, ctx.liveBuffers], [0, 0]);
});
