// Explicit pipeline layouts (shaders.js): the WGSL declarations parse, every launcher binds by
// name what its file declares (over a stand-in device: no GPU), error scopes stay around
// synchronous work, pipeline failures name the pipeline, and the sizes a WGSL const shares with
// its launcher agree (where an override cannot carry them).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { checked } from '../../static/js/engine/gpu.js';
import { Kernels, attentionDsNumel } from '../../static/js/engine/kernels.js';
import { WBK } from '../../static/js/engine/matmul_tiles.js';
import { BLOCK_THREADS, Optimizer } from '../../static/js/engine/optimizer.js';
import { ShaderLibrary, bindGroup, parseBindings } from '../../static/js/engine/shaders.js';
import { REPO } from './paths.mjs';

const SHADERS = path.join(REPO, 'shaders');
const load = async (f) => fs.readFileSync(path.join(SHADERS, f), 'utf8');
const FILES = fs.readdirSync(SHADERS).filter((f) => f.endsWith('.wgsl')).sort();

// Dawn's and the browser's globals, for this file's process only (node --test runs each file in
// its own process; engine_imports.test.mjs checks the engine imports without them).
globalThis.GPUShaderStage = { COMPUTE: 4 };
globalThis.GPUBufferUsage = { STORAGE: 128, UNIFORM: 64, COPY_SRC: 4, COPY_DST: 8 };

/** A device that records what is made; pipelines fail for entry points in `failing`. */
function fakeDevice({ failing = [] } = {}) {
  const made = { pipelines: [], groups: [] };
  const scopes = [];
  const device = {
    limits: {},
    scopes,
    createShaderModule: ({ label }) => ({ label,
      getCompilationInfo: async () => ({ messages: [] }) }),
    createBindGroupLayout: (d) => ({ ...d }),
    createPipelineLayout: (d) => ({ ...d }),
    createComputePipelineAsync: async (d) => {
      if (failing.includes(d.compute.entryPoint)) {
        throw Object.assign(new Error('entry point uses binding 3, not in the layout'),
          { name: 'GPUPipelineError', reason: 'validation' });
      }
      made.pipelines.push(d);
      return d;
    },
    createBindGroup: (d) => { made.groups.push(d); return d; },
    createBuffer: (d) => ({ size: d.size, label: d.label, destroy() {} }),
    queue: { writeBuffer() {} },
    pushErrorScope: (f) => scopes.push(f),
    popErrorScope: () => { scopes.pop(); return Promise.resolve(null); },
  };
  return { device, made };
}

const buf = (label, size = 1 << 20) => ({ label, size, destroy() {} });

test('parseBindings: group-0 buffers by number, types from address space and access', () => {
  const code = `
    // @group(0) @binding(7) var<storage, read_write> commented: array<f32>;
    @group(0) @binding(2) var<storage, read_write> out: array<f32>;
    @group(0) @binding(0) var<uniform> dims: Dims;
    @group(0) @binding(1) var<storage> a: array<f32>;
    @group(0)
    @binding(3) var<storage, read> b4: array<vec4<f32>>;
    var<workgroup> tile: array<f32, 64>;`;
  assert.deepEqual(parseBindings(code), [
    { binding: 0, name: 'dims', type: 'uniform' },
    { binding: 1, name: 'a', type: 'read-only-storage' },
    { binding: 2, name: 'out', type: 'storage' },
    { binding: 3, name: 'b4', type: 'read-only-storage' },
  ]);
  assert.throws(() => parseBindings('@group(1) @binding(0) var<uniform> u: U;', 'x.wgsl'),
    /x.wgsl: binding u is not in @group\(0\)/);
  assert.throws(() => parseBindings('@group(0) @binding(0) var t: texture_2d<f32>;'), /not a buffer/);
  assert.throws(() => parseBindings(`@group(0) @binding(1) var<uniform> u: U;
    @group(0) @binding(1) var<storage> v: array<f32>;`), /declared twice/);
});

test('every WGSL file declares its bindings once, kernel files one uniform each', async () => {
  const lib = new ShaderLibrary(fakeDevice().device, load);
  for (const file of FILES) {
    const bindings = parseBindings(await lib.source(file), file);
    assert.ok(bindings.length > 0, file);
    const uniforms = bindings.filter((b) => b.type === 'uniform').length;
    if (file === '12_optimizer.wgsl') assert.equal(uniforms, 2);   // hp and cu
    else assert.ok(uniforms === (file === '00_selftest.wgsl' ? 0 : 1), file);
  }
});

/** Every op of every launcher, over fake buffers: [{file, entry, label, bound: {name: binding}}]. */
async function allOps(T) {
  const { device, made } = fakeDevice();
  const lib = new ShaderLibrary(device, load);
  const k = new Kernels(device, lib, { maxHeadDim: 128 });
  const soft = new Kernels(device, lib, { maxHeadDim: 128, software: true });   // main_direct
  const B = 2; const H = 2; const D = 16; const N = B * T; const C = H * D;
  const b = Object.fromEntries(['tokens', 'wte', 'x', 'buckets', 'dx', 'dwte', 'g', 'y', 'rstd',
    'dy', 'dg', 'part', 'w', 'dw', 'qkv', 'table', 'lse', 'delta', 'dqkv', 'gu', 'h', 'dh', 'dgu',
    'logits', 'targets', 'losses'].map((name) => [name, buf(name)]));
  const ds = buf('ds', 4 * attentionDsNumel(B, T, H));
  const ops = (await Promise.all([
    k.embed({ ...b, N, C }), k.embedBackward({ ...b, N, C, V: 50 }),
    k.rmsnorm({ ...b, N, C, eps: 1e-5 }), k.rmsnormBackward({ ...b, N, C }),
    k.rmsnormBackwardGain({ ...b, N, C }),
    k.linear({ ...b, M: N, N: 3 * C, K: C }), k.linearBackwardInput({ ...b, M: N, N: C, K: C }),
    k.linearBackwardWeight({ ...b, M: 1000, N: 40, K: 24 }),   // split-K: MODE 2 + add_partials
    k.linearBackwardWeight({ ...b, M: 37, N: 45, K: 19 }),     // MODE 1
    k.linear({ ...b, M: 1031, N: 515, K: 509 }),               // the wide tile
    soft.linear({ ...b, M: N, N: 3 * C, K: C }), soft.linearBackwardInput({ ...b, M: N, N: C, K: C }),
    soft.linearBackwardWeight({ ...b, M: 1000, N: 40, K: 24 }),
    soft.linearBackwardWeight({ ...b, M: 37, N: 45, K: 19 }),
    k.rope({ ...b, N, T, H, D }),
    k.attention({ ...b, B, T, H, D }), k.attentionBackward({ ...b, ds, B, T, H, D }),
    k.attentionBackward({ ...b, ds: buf('ds', 16), B, T, H, D }),
    soft.attention({ ...b, B, T, H, D }), soft.attentionBackward({ ...b, ds, B, T, H, D }),
    k.swiglu({ ...b, N, F: 40 }), k.swigluBackward({ ...b, N, F: 40 }),
    k.crossEntropy({ ...b, N, V: 50 }),
    k.init({ ...b, numel: 100, seed: 1, stream: 0, mode: 0, std: 0.02 }),
  ])).flat();
  const out = [];
  for (const op of ops) {
    const names = Object.fromEntries((await lib.bindings(op.file)).map((d) => [d.binding, d]));
    const group = op.bindGroup;
    // The group's layout is the pipeline's, entry for entry, typed as the WGSL declares.
    assert.equal(op.pipeline.layout.bindGroupLayouts[0], group.layout, op.label);
    assert.deepEqual(group.layout.entries.map((e) => [e.binding, e.buffer.type]),
      group.entries.map((e) => [e.binding, names[e.binding].type]), op.label);
    out.push({ file: op.file, entry: op.entry, label: op.label,
      bound: Object.fromEntries(group.entries.map((e) => [names[e.binding].name,
        e.resource.buffer.label ?? e.resource.buffer])) });
  }
  return { out, made };
}

test('launchers bind by WGSL name; entry points leave out what they never touch', async () => {
  for (const T of [64, 130]) {   // the row kernels, the tiled ones
    const { out } = await allOps(T);
    const find = (entry, file) => out.filter((o) => o.entry === entry && (!file || o.file === file));
    for (const o of out) assert.ok(o.bound.dims || o.bound.mm || o.bound.p, `${o.label}: no uniform`);
    assert.deepEqual(Object.keys(find('gain_partial')[0].bound), ['dims', 'dy', 'x', 'rstd', 'part']);
    assert.deepEqual(Object.keys(find('gain_finish')[0].bound), ['dims', 'out', 'part']);
    assert.equal(find('gain_finish')[0].bound.out, 'dg');
    assert.deepEqual(Object.keys(find('loss_mean')[0].bound), ['dims', 'losses']);
    assert.deepEqual(find('add_partials')[0].bound, { mm: 'linear_backward_weight.dims', dy: 'part', out: 'dw' });
    assert.deepEqual(find('rmsnorm_backward_input')[0].bound.out, 'dx');
    if (T === 130) {
      const file = '10_attention_backward.wgsl';
      assert.deepEqual(Object.keys(find('attention_backward_delta', file)[0].bound),
        ['dims', 'qkv', 'y', 'dy', 'delta', 'qkv4', 'dy4']);
      for (const o of [...find('attention_backward_dq', file), ...find('attention_backward_dkdv', file)]) {
        assert.equal(Object.keys(o.bound).length, 10, o.label);   // all of the file's bindings
      }
      assert.equal(find('main', '05_attention.wgsl')[0].bound.qkv4, 'qkv');
    } else {   // a software adapter's row attention (attention_direct.js) binds as the row kernels
      const same = (entry, rows, direct) => assert.deepEqual(
        find(`${entry}_direct`, direct)[0].bound, find(entry, rows)[0].bound, entry);
      same('main', '05_attention_rows.wgsl', 'attention_direct.js forward D16');
      for (const entry of ['attention_backward_dq', 'attention_backward_dkdv']) {
        same(entry, '10_attention_backward_rows.wgsl', 'attention_direct.js backward D16');
      }
    }
  }
});

test('the tiled attention kernels get their block size from the launcher', async () => {
  const { made } = await allOps(130);
  const tiled = made.pipelines.filter((p) => /^(05_attention|10_attention_backward)\.wgsl:/.test(p.label));
  assert.equal(tiled.length, 6);   // forward; delta, dkdv, dq with dS; dq, dkdv without
  for (const p of tiled) assert.equal(p.compute.constants.BLK, 64, p.label);
  const wgsl = await new ShaderLibrary(fakeDevice().device, load).source('05_attention.wgsl');
  assert.match(wgsl, /override BLK: u32;/);                  // no default: always passed
  assert.match(wgsl, /override WG: u32 = \(BLK \/ 4u\) \* \(BLK \/ 4u\);/);
});

test('optimizer entry points bind their names, within 8 storage buffers', async () => {
  for (const variant of ['adamw', 'adamw_f16', 'adamw_8bit', 'adamw_8bit_f16']) {
    const { device, made } = fakeDevice();
    const lib = new ShaderLibrary(device, load);
    const n = 8576;
    const layout = {
      total_numel: n, decay_numel: 4224,
      params: [{ name: 'a', offset: 0, numel: 4096 + 100 }, { name: 'b', offset: 4224, numel: 4352 }],
      optimizer_state: { adamw_8bit: { f32_tensors: ['b'], q_blocks: 17, f32_numel: 4352 } },
    };
    const maps = { blocksize: 256, min_8bit_size: 4096,
      signed: Array.from({ length: 256 }, (_, i) => (i - 127) / 128),
      unsigned: Array.from({ length: 256 }, (_, i) => i / 255) };
    const ctx = { device, lib, software: false, limits: { maxComputeInvocationsPerWorkgroup: 256,
      maxStorageBufferBindingSize: 2 ** 27, maxStorageBuffersPerShaderStage: 8 } };
    const hyper = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_norm: 1, clip_mode: 'global' };
    const opt = await Optimizer.create(ctx, layout, { variant, W: buf('W', 4 * n), G: buf('G', 4 * n), maps, hyper });
    const storage = (p) => p.layout.bindGroupLayouts[0].entries.filter((e) => e.buffer.type !== 'uniform').length;
    const update = made.pipelines.find((p) => p.compute.entryPoint.includes('update'));
    assert.equal(storage(update), opt.storageBuffersNeeded, variant);
    assert.ok(opt.storageBuffersNeeded <= 8, variant);
    // One window: reduce, scale (per-tensor clipping), finalize per tensor, finalize, update.
    assert.equal(made.groups.length, 5, variant);
  }
});

test('checked: scopes around synchronous work only, popped before it returns', async () => {
  const { device } = fakeDevice();
  const results = await Promise.all([1, 2, 3].map((i) => {
    const p = checked(device, `op ${i}`, () => i);
    assert.equal(device.scopes.length, 0);   // nothing left pushed while others run
    return p;
  }));
  assert.deepEqual(results, [1, 2, 3]);
  await assert.rejects(checked(device, 'late', async () => 1), /late: checked\(\) scopes synchronous work only/);
  assert.equal(device.scopes.length, 0);
  await assert.rejects(checked(device, 'js', () => { throw new Error('boom'); }), /boom/);
  assert.equal(device.scopes.length, 0);
  const failing = { ...device,
    popErrorScope: () => Promise.resolve(device.scopes.pop() === 'validation' ? { message: 'bad size' } : null) };
  await assert.rejects(checked(failing, 'bind group x', () => 1), /^Error: bind group x: bad size$/);
});

test('pipeline creation failures name the pipeline; bind groups refuse unknown names', async () => {
  const { device } = fakeDevice({ failing: ['loss_mean'] });
  const lib = new ShaderLibrary(device, load);
  await assert.rejects(lib.pipeline('07_loss.wgsl', 'loss_mean', { WG: 64 }, ['dims', 'losses']),
    /pipeline 07_loss.wgsl:loss_mean \{"WG":64\}: entry point uses binding 3/);
  await assert.rejects(lib.pipeline('07_loss.wgsl', 'cross_entropy', {}, ['dims', 'loss']),
    /07_loss.wgsl declares no binding loss/);
  const p = await lib.pipeline('06_swiglu.wgsl', 'main', { WG: 64 });
  assert.deepEqual(p.bindings.map((b) => b.name), ['dims', 'gu', 'h']);
  assert.throws(() => bindGroup(device, p, { dims: buf('d'), gu: buf('g') }), /no buffer for .*binding 2 \(h\)/);
  assert.throws(() => bindGroup(device, p, { dims: buf('d'), gu: buf('g'), h: buf('h'), x: buf('x') }),
    /binds no x/);
});

test('sizes a WGSL const shares with its launcher agree', async () => {
  const core = await load('lib/matmul_core.wgsl');
  assert.equal(Number(core.match(/const WBK: u32 = (\d+)u;/)[1]), WBK);   // matmul_tiles.js WIDE_BIG_BYTES
  const opt = await load('12_optimizer.wgsl');
  assert.equal(Number(opt.match(/override WG8: u32 = (\d+)u \* BPW;/)[1]), BLOCK_THREADS);
});
