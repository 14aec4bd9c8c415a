// WebGPU device acquisition and the one place where GPU failures are caught.
// DOM-free: the caller hands in the `gpu` object (navigator.gpu in a page, Dawn's binding in Node).

// Limits the engine cares about; we request the adapter's real values, not the defaults.
export const WANTED_LIMITS = [
  'maxStorageBufferBindingSize',
  'maxBufferSize',
  'maxStorageBuffersPerShaderStage',
  'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup',
  'maxComputeWorkgroupSizeX',
  'maxComputeWorkgroupsPerDimension',
  'maxBindGroups',
  'minStorageBufferOffsetAlignment',
  'maxUniformBufferBindingSize',
];

// Optional features every device asks for when present: timestamp-query times the optimizer pass
// (trainer.js) and each kernel (profiler.js). The fp32 kernels use neither subgroups nor
// shader-f16 (the f16 mirror is packed with pack2x16float, core WGSL); a mixed-precision run's
// matmuls need mma.js MMA_FEATURES, which context.js requests for a context made with `mixed`.
export const WANTED_FEATURES = ['timestamp-query'];

export class GPUUnavailableError extends Error {
  constructor(reason, message) {
    super(message);
    this.name = 'GPUUnavailableError';
    this.reason = reason; // 'no-webgpu' | 'no-adapter' | 'no-device'
  }
}

function adapterInfoOf(adapter) {
  // `adapter.info` is the standard; older Chromes only had requestAdapterInfo().
  const info = adapter.info || {};
  return {
    vendor: info.vendor || '',
    architecture: info.architecture || '',
    device: info.device || '',
    description: info.description || '',
    // isFallbackAdapter moved from the adapter to adapter.info; SwiftShader reports itself here.
    isFallbackAdapter: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
  };
}

function isSoftware(info) {
  const text = `${info.vendor} ${info.architecture} ${info.device} ${info.description}`.toLowerCase();
  return info.isFallbackAdapter || /swiftshader|llvmpipe|lavapipe|software|cpu/.test(text);
}

/** A lost device's GPUDeviceLostInfo in words. */
export function lostMessage(info) {
  return `GPU device lost (${info.reason})${info.message ? `: ${info.message}` : ''}`;
}

/**
 * Acquire adapter and device with the adapter's real limits and the optional features it has
 * (WANTED_FEATURES, and the caller's optionalFeatures).
 * Returns { adapter, device, info, features: string[], limits: {name: value}, software: bool,
 *           errors: string[] }. `errors` collects uncaptured GPU errors; `onError` and `onLost`
 * are told about them too.
 */
export async function acquireDevice(gpu, { powerPreference = 'high-performance',
  requiredFeatures = [], optionalFeatures = [], onError = null, onLost = null } = {}) {
  if (!gpu) throw new GPUUnavailableError('no-webgpu', 'WebGPU is not available (no GPU object).');
  const adapter = await gpu.requestAdapter({ powerPreference });
  if (!adapter) {
    throw new GPUUnavailableError('no-adapter', 'WebGPU is present but no adapter was offered.');
  }
  for (const f of requiredFeatures) {
    if (!adapter.features.has(f)) {
      throw new GPUUnavailableError('no-device', `This adapter lacks the required feature "${f}".`);
    }
  }
  const features = [...new Set([...requiredFeatures,
    ...[...WANTED_FEATURES, ...optionalFeatures].filter((f) => adapter.features.has(f))])];
  const requiredLimits = {};
  for (const name of WANTED_LIMITS) {
    if (adapter.limits[name] !== undefined) requiredLimits[name] = adapter.limits[name];
  }
  let device;
  try {
    device = await adapter.requestDevice({ requiredFeatures: features, requiredLimits });
  } catch (e) {
    throw new GPUUnavailableError('no-device', `requestDevice failed: ${e.message || e}`);
  }
  const errors = [];
  device.addEventListener('uncapturederror', (event) => {
    const msg = event.error?.message || String(event.error);
    errors.push(msg);
    if (onError) onError(msg);
    else console.error('WebGPU error:', msg);
  });
  device.lost.then((lost) => {
    const msg = lostMessage(lost);
    errors.push(msg);
    if (onLost) onLost(msg);
    else if (lost.reason !== 'destroyed') console.error(msg);
  });
  const limits = {};
  for (const name of WANTED_LIMITS) limits[name] = device.limits[name];
  const info = adapterInfoOf(adapter);
  return { adapter, device, info, features: [...device.features].sort(), limits,
    software: isSoftware(info), errors };
}

/**
 * Run synchronous `fn` inside validation + out-of-memory error scopes; resolves to its result, or
 * rejects with the first error, prefixed with `label`. The scopes are pushed and popped around
 * `fn` alone, with nothing awaited in between, so concurrent callers (pipelines built under
 * Promise.all) never see each other's errors. Asynchronous GPU calls report their own failures
 * (createComputePipelineAsync rejects with a GPUPipelineError): handle those where they are made.
 */
export async function checked(device, label, fn) {
  device.pushErrorScope('out-of-memory');
  device.pushErrorScope('validation');
  let result;
  let thrown = null;
  try {
    result = fn();
  } catch (e) {
    thrown = e;
  }
  const scopes = [device.popErrorScope(), device.popErrorScope()];   // at once, whatever fn did
  if (thrown) throw thrown;
  if (typeof result?.then === 'function') {
    throw new Error(`${label}: checked() scopes synchronous work only`);
  }
  const [validation, oom] = await Promise.all(scopes);
  const err = validation || oom;
  if (err) throw new Error(`${label}: ${err.message}`);
  return result;
}

export const align = (n, a) => Math.ceil(n / a) * a;

/** A storage buffer, optionally filled from a typed array. Size is rounded up to 4 bytes. */
export function storageBuffer(device, size, { label, data = null, usage = 0 } = {}) {
  const buffer = device.createBuffer({
    label,
    size: align(Math.max(size, 4), 4),
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST | usage,
  });
  if (data) device.queue.writeBuffer(buffer, 0, data.buffer, data.byteOffset, data.byteLength);
  return buffer;
}

/** Copy `size` bytes of `buffer` (from `offset`) to the CPU. For tests and tools, not per step. */
export async function readBuffer(device, buffer, size = buffer.size, offset = 0) {
  const staging = device.createBuffer({ size: align(size, 4),
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buffer, offset, staging, 0, align(size, 4));
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const copy = staging.getMappedRange().slice(0, size);
  staging.unmap();
  staging.destroy();
  return copy;
}
