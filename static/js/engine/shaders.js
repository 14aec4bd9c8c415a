// WGSL source loading, explicit pipeline layouts and pipeline creation, cached. The loader is
// injected: fetchLoader() in a page, any async (file) => text elsewhere (the Node benches read
// shaders/ from disk).
//
// Layouts are explicit, not 'auto': a WGSL file's `@group(0) @binding(n) var<...> name` lines are
// its one declaration of its bindings (parsed once per file: parseBindings), and a pipeline's
// layout holds the bindings its launcher names, with the types the WGSL gives them (uniform,
// read-only-storage for `var<storage, read>`, storage for `read_write`). Launchers bind buffers
// by those names (bindGroup), so a binding is never picked or skipped by its index.

import { checked } from './gpu.js';

/** Loader that fetches WGSL from the server's /shaders mount. */
export function fetchLoader(base = '/shaders/') {
  return async (name) => {
    const res = await fetch(base + name);
    if (!res.ok) throw new Error(`cannot load shader ${name}: HTTP ${res.status}`);
    return res.text();
  };
}

const BINDING = /((?:@(?:group|binding)\(\s*\d+\s*\)\s*){2})var\s*(?:<([^>]*)>)?\s*([A-Za-z_]\w*)/g;

/**
 * The resource bindings WGSL `code` declares, [{binding, name, type}] by binding number; type is
 * the GPUBufferBindingType: 'uniform' (var<uniform>), 'read-only-storage' (var<storage> or
 * var<storage, read>) or 'storage' (var<storage, read_write>). Comments do not count. Only
 * buffers in group 0 are supported (the engine binds one group), and names and numbers are unique.
 */
export function parseBindings(code, file = 'WGSL') {
  const text = code.replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '');
  const out = [];
  for (const [, attrs, space = '', name] of text.matchAll(BINDING)) {
    const group = Number(attrs.match(/@group\(\s*(\d+)/)?.[1]);
    const binding = Number(attrs.match(/@binding\(\s*(\d+)/)?.[1]);
    const [as, access = 'read'] = space.split(',').map((s) => s.trim());
    const type = as === 'uniform' ? 'uniform'
      : as === 'storage' && access === 'read' ? 'read-only-storage'
        : as === 'storage' && access === 'read_write' ? 'storage' : null;
    if (group !== 0 || Number.isNaN(binding)) {
      throw new Error(`${file}: binding ${name} is not in @group(0)`);
    }
    if (!type) throw new Error(`${file}: binding ${name} (var<${space}>) is not a buffer`);
    if (out.some((b) => b.binding === binding || b.name === name)) {
      throw new Error(`${file}: binding ${binding} (${name}) is declared twice`);
    }
    out.push({ binding, name, type });
  }
  return out.sort((a, b) => a.binding - b.binding);
}

/** Compiles each WGSL file once, and each (file, entry point, constants, bindings) pipeline once. */
export class ShaderLibrary {
  constructor(device, load) {
    this.device = device;
    this.load = load;
    this.shaders = new Map();     // file -> Promise<{module, bindings, label}>
    this.layouts = new Map();     // binding types -> Promise<{group, layout}>
    this.pipelines = new Map();   // file|entry|constants|names -> Promise<pipeline record>
  }

  /** {module, bindings, label, code} of `file` (includes expanded), compiled and parsed once. */
  shader(file) {
    if (!this.shaders.has(file)) {
      this.shaders.set(file, this.source(file).then((code) => this.compile(code, file)));
    }
    return this.shaders.get(file);
  }

  /** The compiled module of `file`. */
  async module(file) {
    return (await this.shader(file)).module;
  }

  /** Whether `file` is a shader file or a name define() took (not a JS module, such as the
   *  mixed kernels' mma.js, which compiles its WGSL itself). */
  knows(file) {
    return file.endsWith('.wgsl') || this.shaders.has(file);
  }

  /** The WGSL `file` compiles from: a file's with its includes expanded, or what define() gave. */
  async code(file) {
    return (await this.shader(file)).code;
  }

  /** `file`'s bindings as parseBindings lists them. */
  async bindings(file) {
    return (await this.shader(file)).bindings;
  }

  /** {module, bindings, label, code} of WGSL `code` (not cached; shader() caches by file). WGSL errors
   *  are reported with their lines, any other failure of the module with `label`. */
  async compile(code, label) {
    const bindings = parseBindings(code, label);
    let module;
    const created = checked(this.device, `shader ${label}`, () => {
      module = this.device.createShaderModule({ label, code });
    });
    if (!module) await created;   // createShaderModule threw
    created.catch(() => {});      // awaited below, after the compiler's messages
    const info = await module.getCompilationInfo();
    const errs = info.messages.filter((m) => m.type === 'error');
    if (errs.length) {
      throw new Error(`WGSL errors in ${label}:\n` +
        errs.map((m) => `  ${m.lineNum}:${m.linePos} ${m.message}`).join('\n'));
    }
    await created;
    return { module, bindings, label, code };
  }

  /** WGSL text with `//#include "lib/x.wgsl"` lines replaced by that file (WGSL has no imports;
   *  module-scope declarations are order-independent, so a shared core can call accessors that
   *  the including file defines). */
  async source(file, stack = []) {
    if (stack.includes(file)) throw new Error(`include cycle: ${[...stack, file].join(' -> ')}`);
    return this.expand(await this.load(file), [...stack, file]);
  }

  /** `code` (of the file at the end of `stack`) with its includes replaced. */
  async expand(code, stack) {
    const parts = await Promise.all(code.split('\n').map(async (line) => {
      const m = line.match(/^\/\/#include "([^"]+)"\s*$/);
      return m ? this.source(m[1], stack) : line;
    }));
    return parts.join('\n');
  }

  /** Takes WGSL `code` made in JS (its includes expanded as a file's) as the file `name`, so
   *  shader(), bindings() and pipeline() take it as they take a file; `code()` runs once a name. */
  define(name, code) {
    if (!this.shaders.has(name)) {
      this.shaders.set(name, this.expand(code(), [name]).then((c) => this.compile(c, name)));
    }
    return name;
  }

  /**
   * The pipeline of `file`'s `entryPoint`; `constants` fills its `override` declarations and
   * `names` are the bindings it binds (default: every one the file declares; an entry point may
   * leave out those it never touches). Resolves to {pipeline, bindGroupLayout, bindings, label}:
   * the GPUComputePipeline, its group-0 layout and those bindings (parseBindings' entries).
   */
  pipeline(file, entryPoint = 'main', constants = {}, names = null) {
    const key = `${file}|${entryPoint}|${JSON.stringify(constants)}|${names ? [...names].sort() : '*'}`;
    if (!this.pipelines.has(key)) {
      this.pipelines.set(key, this.shader(file).then((shader) =>
        this.pipelineOf(shader, entryPoint, constants, names)));
    }
    return this.pipelines.get(key);
  }

  /** pipeline() for a compiled shader ({module, bindings, label}: shader() or compile()), not
   *  cached. A failure rejects with the pipeline's label, file:entry and constants. */
  async pipelineOf(shader, entryPoint, constants = {}, names = null) {
    const label = `${shader.label}:${entryPoint}`;
    const bindings = names ? names.map((n) => {
      const b = shader.bindings.find((d) => d.name === n);
      if (!b) throw new Error(`pipeline ${label}: ${shader.label} declares no binding ${n}`);
      return b;
    }).sort((a, b) => a.binding - b.binding) : shader.bindings;
    const { group, layout } = await this.layout(bindings);
    let pipeline;
    try {
      pipeline = await this.device.createComputePipelineAsync({
        label, layout, compute: { module: shader.module, entryPoint, constants },
      });
    } catch (e) {   // a GPUPipelineError: the async call's own report, not an error scope's
      throw new Error(`pipeline ${label} ${JSON.stringify(constants)}: ${e.message}`, { cause: e });
    }
    return { pipeline, bindGroupLayout: group, bindings, label };
  }

  /** Bind group layout and pipeline layout (one group) for `bindings`, made once per list of
   *  binding types. */
  layout(bindings) {
    const key = bindings.map((b) => `${b.binding}:${b.type}`).join(',');
    if (!this.layouts.has(key)) {
      this.layouts.set(key, checked(this.device, `layout [${key}]`, () => {
        const group = this.device.createBindGroupLayout({
          label: key,
          entries: bindings.map((b) => ({
            binding: b.binding, visibility: GPUShaderStage.COMPUTE, buffer: { type: b.type },
          })),
        });
        const layout = this.device.createPipelineLayout({ label: key, bindGroupLayouts: [group] });
        return { group, layout };
      }));
    }
    return this.layouts.get(key);
  }
}

/** Bind group for `p` (a ShaderLibrary pipeline record) from `resources`: {binding name: buffer
 *  or {buffer, offset, size} sub-range}, exactly one for each of the pipeline's bindings. */
export function bindGroup(device, p, resources, label = p.label) {
  const extra = Object.keys(resources).filter((n) => !p.bindings.some((b) => b.name === n));
  if (extra.length) throw new Error(`${label}: ${p.label} binds no ${extra.join(', ')}`);
  return device.createBindGroup({
    label,
    layout: p.bindGroupLayout,
    entries: p.bindings.map(({ binding, name }) => {
      const r = resources[name];
      if (!r) throw new Error(`${label}: no buffer for ${p.label}'s binding ${binding} (${name})`);
      return { binding, resource: r.buffer ? r : { buffer: r } };
    }),
  });
}
