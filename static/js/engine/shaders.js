// WGSL source loading and pipeline creation, cached. The loader is injected: fetchLoader() in a
// page, any async (file) => text elsewhere (the Node benches read shaders/ from disk).

import { checked } from './gpu.js';

/** Loader that fetches WGSL from the server's /shaders mount. */
export function fetchLoader(base = '/shaders/') {
  return async (name) => {
    const res = await fetch(base + name);
    if (!res.ok) throw new Error(`cannot load shader ${name}: HTTP ${res.status}`);
    return res.text();
  };
}

/** Compiles each WGSL file once and each (file, entry point, constants) pipeline once. */
export class ShaderLibrary {
  constructor(device, load) {
    this.device = device;
    this.load = load;
    this.modules = new Map();
    this.pipelines = new Map();
  }

  async module(file) {
    if (!this.modules.has(file)) {
      this.modules.set(file, (async () => {
        const code = await this.source(file);
        const module = this.device.createShaderModule({ label: file, code });
        const info = await module.getCompilationInfo();
        const errs = info.messages.filter((m) => m.type === 'error');
        if (errs.length) {
          throw new Error(`WGSL errors in ${file}:\n` +
            errs.map((m) => `  ${m.lineNum}:${m.linePos} ${m.message}`).join('\n'));
        }
        return module;
      })());
    }
    return this.modules.get(file);
  }

  /** WGSL text with `//#include "lib/x.wgsl"` lines replaced by that file (WGSL has no imports;
   *  module-scope declarations are order-independent, so a shared core can call accessors that
   *  the including file defines). */
  async source(file, stack = []) {
    if (stack.includes(file)) throw new Error(`include cycle: ${[...stack, file].join(' -> ')}`);
    const code = await this.load(file);
    const parts = await Promise.all(code.split('\n').map(async (line) => {
      const m = line.match(/^\/\/#include "([^"]+)"\s*$/);
      return m ? this.source(m[1], [...stack, file]) : line;
    }));
    return parts.join('\n');
  }

  /** Pipeline with an 'auto' layout; `constants` fills the file's `override` declarations. */
  async pipeline(file, entryPoint = 'main', constants = {}) {
    const key = `${file}|${entryPoint}|${JSON.stringify(constants)}`;
    if (!this.pipelines.has(key)) {
      this.pipelines.set(key, (async () => {
        const module = await this.module(file);
        return checked(this.device, `pipeline ${file}:${entryPoint}`, () =>
          this.device.createComputePipelineAsync({
            label: `${file}:${entryPoint}`,
            layout: 'auto',
            compute: { module, entryPoint, constants },
          }));
      })());
    }
    return this.pipelines.get(key);
  }
}

/** Bind group for `pipeline` from a list of buffers or {buffer, offset, size} sub-ranges. */
export function bindGroup(device, pipeline, resources, label) {
  return device.createBindGroup({
    label,
    layout: pipeline.getBindGroupLayout(0),
    entries: resources.map((r, binding) => ({
      binding,
      resource: r.buffer ? r : { buffer: r },
    })),
  });
}
