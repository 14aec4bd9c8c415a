// The engine context: adapter, device, limits, features, software flag and shader library,
// assembled in this one place for the pages, the lab and the Node benches. It also counts the
// GPU buffers the engine holds (ctx.allocatedBytes, ctx.liveBuffers): every buffer made on
// ctx.device is counted from createBuffer until its destroy(), so a leak shows as a count that
// does not come back.
//
//   const ctx = await createContext({gpu: navigator.gpu, load: fetchLoader(SHADER_BASE)});
//   ... Model, Optimizer, Trainer take ctx ...
//   ctx.destroy();   // the device, and with it everything still allocated on it

import { acquireDevice } from './gpu.js';
import { MMA_FEATURES, mixedSupport } from './mma.js';
import { ShaderLibrary } from './shaders.js';

/**
 * gpu: navigator.gpu or Dawn's gpu object; load: (file) => WGSL text (fetchLoader() in a page);
 * onError / onLost: told about uncaptured GPU errors and device loss (gpu.js acquireDevice).
 * mixed: what mixed precision (mma.js) is to this context: 'required' (its features are
 * required of the adapter, and a device that still cannot run it is refused with why),
 * 'optional' (requested where the adapter has them) or false (the fp32 engine needs neither).
 * This is the one place that requests those features and asks mixedSupport: ctx.mixed says
 * {ok, why}, and a mixed Model reads it.
 * Returns {adapter, device, info, features, limits, software, mixed, lib, errors, allocatedBytes,
 *          liveBuffers, destroy()}.
 */
export async function createContext({ gpu, load, onError = null, onLost = null,
  powerPreference = 'high-performance', mixed = false } = {}) {
  if (![false, 'optional', 'required'].includes(mixed)) throw new Error(`mixed: ${mixed}?`);
  const acquired = await acquireDevice(gpu, { powerPreference,
    requiredFeatures: mixed === 'required' ? MMA_FEATURES : [],
    optionalFeatures: mixed === 'optional' ? MMA_FEATURES : [],
    onError, onLost });
  const support = mixed ? mixedSupport(acquired) : { ok: false, why: 'not requested' };
  if (mixed === 'required' && !support.ok) {
    acquired.device.destroy();
    throw Object.assign(new Error(support.why), { reason: 'no-mixed', acquired });
  }
  const ctx = { ...acquired, mixed: support, allocatedBytes: 0, liveBuffers: 0 };
  countBuffers(ctx);
  ctx.lib = new ShaderLibrary(ctx.device, load);
  ctx.closing = false;   // set by destroy(): the device's loss then is ours, not a failure
  ctx.destroy = () => { ctx.closing = true; ctx.device.destroy(); };
  return ctx;
}

// Wraps the device's createBuffer and each buffer's destroy (own properties that shadow the
// prototype's methods), so code that calls device.createBuffer anywhere is counted.
function countBuffers(ctx) {
  const { device } = ctx;
  const create = device.createBuffer.bind(device);
  device.createBuffer = (desc) => {
    const buffer = create(desc);
    const { size } = desc;
    ctx.allocatedBytes += size;
    ctx.liveBuffers += 1;
    const destroy = buffer.destroy.bind(buffer);
    let live = true;
    buffer.destroy = () => {
      if (live) {   // destroy() may be called twice; count it once
        live = false;
        ctx.allocatedBytes -= size;
        ctx.liveBuffers -= 1;
      }
      destroy();
    };
    return buffer;
  };
}
