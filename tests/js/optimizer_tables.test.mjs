// Host tables of the optimizer: the 8-bit block plan and state layout (same rules and sizes as
// server/optim.py block_plan / optimizer_memory) and the f16 packing of the weight mirror.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { buildBlockPlan, f16Bits, packHalf2, stateLayout8 } from '../../static/js/engine/optimizer_tables.js';

const RULES = { blocksize: 256, min_8bit_size: 4096 };   // what GET /api/optimizer/maps sends
// What the server's layout says keeps f32 state (optimizer_state.adamw_8bit.f32_tensors): here the
// tensors under min_8bit_size, as server/optim.py f32_tensors lists them.
const F32 = ['b', 'g1', 'g2'];

// A layout in the server's shape: a big matrix, a small one, then two norm gains.
const layout = {
  params: [
    { name: 'a', offset: 0, numel: 4096 + 100 },     // 8-bit, 17 blocks (the last one 100 long)
    { name: 'b', offset: 4224, numel: 4092 },        // under min_8bit_size: f32 state
    { name: 'g1', offset: 8320, numel: 12 },         // f32 state
    { name: 'g2', offset: 8448, numel: 64 },         // f32 state
  ],
  total_numel: 8576,
};

const rows = (plan) => Array.from({ length: plan.nBlocks }, (_, b) => Array.from(plan.entries.subarray(4 * b, 4 * b + 4)));

test('block plan: blocks never straddle tensors; listed tensors f32, the others 8-bit', () => {
  const plan = buildBlockPlan(layout, RULES, F32);
  const r = rows(plan);
  assert.equal(plan.qBlocks, 17);
  assert.equal(plan.f32Numel, 4092 + 12 + 64);
  assert.equal(plan.nBlocks, 17 + 16 + 1 + 1);
  assert.deepEqual(r[0], [0, 256, 0, 0]);
  assert.deepEqual(r[16], [4096, 100, 16, 0]);        // the short tail block of `a`
  assert.deepEqual(r[17], [4224, 256, 0, 1]);         // `b` starts its own block; f32 slot 0
  assert.deepEqual(r[32], [4224 + 15 * 256, 252, 15 * 256, 1]);
  assert.deepEqual(r[33], [8320, 12, 4092, 1]);       // f32 slots: numels rounded up to 4
  assert.deepEqual(r[34], [8448, 64, 4092 + 12, 1]);
  for (const [start, len] of r) {
    const p = layout.params.find((q) => start >= q.offset && start < q.offset + q.numel);
    assert.ok(start + len <= p.offset + p.numel, `block at ${start} leaves ${p.name}`);
  }
});

test('block plan follows the server\'s blocksize and f32 list, never numel', () => {
  const plan = buildBlockPlan(layout, { blocksize: 128, min_8bit_size: 4000 }, ['g1', 'g2']);
  assert.equal(plan.qBlocks, 33 + 32);   // a: ceil(4196 / 128); b: not listed, so 8-bit
  assert.equal(plan.f32Numel, 12 + 64);
  const embed = buildBlockPlan(layout, RULES, ['a', 'b', 'g1', 'g2']);   // a big tensor kept f32
  assert.equal(embed.qBlocks, 0);
  assert.equal(embed.f32Numel, 4196 + 4092 + 12 + 64);
  assert.deepEqual(rows(embed)[0], [0, 256, 0, 1]);
  assert.deepEqual(rows(embed)[17], [4224, 256, 4196, 1]);
  assert.throws(() => buildBlockPlan(layout, {}, F32), /from the server/);
  assert.throws(() => buildBlockPlan(layout, RULES), /come from the server/);   // no list: no guess
  assert.throws(() => buildBlockPlan(layout, RULES, ['nope']), /unknown tensors nope/);
});

test('state layout: the byte counts of server/optim.py optimizer_memory', () => {
  const plan = buildBlockPlan(layout, RULES, F32);
  const s = stateLayout8(plan);
  const absmax = Math.ceil((2 * 17) / 4) * 4;
  assert.equal(s.codesBytes, 2 * 256 * 17);
  assert.equal(s.smallFloats, absmax + 2 * plan.f32Numel);
  assert.equal(s.m32, absmax);
  assert.equal(s.v32, absmax + plan.f32Numel);
  // optimizer_memory: 2 * BLOCKSIZE * q + 4 * (ceil(2q / 4) * 4 + 2 * f32_numel)
  assert.equal(s.codesBytes + 4 * s.smallFloats, 2 * 256 * 17 + 4 * (absmax + 2 * (4092 + 12 + 64)));
});

test('block plan refuses tensors that are not whole vec4s', () => {
  assert.throws(() => buildBlockPlan({ params: [{ name: 'x', offset: 0, numel: 4098 }] }, RULES, []),
    /multiple of 4/);
});

test('f16Bits rounds to nearest even like pack2x16float', () => {
  const cases = [
    [0, 0x0000], [-0, 0x8000], [1, 0x3c00], [-2, 0xc000], [0.5, 0x3800], [65504, 0x7bff],
    [65519, 0x7bff],                 // below the halfway point to 65536: stays finite
    [65520, 0x7c00],                 // halfway, rounds to even: overflows to +Inf
    [Infinity, 0x7c00], [-Infinity, 0xfc00],
    [2 ** -14, 0x0400],              // smallest normal
    [2 ** -24, 0x0001],              // smallest subnormal
    [2 ** -25, 0x0000],              // halfway to it: ties to even (0)
    [3 * 2 ** -25, 0x0002],          // 1.5 subnormal steps: ties to even (2)
    [1 + 2 ** -11, 0x3c00],          // halfway between 1 and the next half: even (1)
    [1 + 3 * 2 ** -11, 0x3c02],      // halfway, odd below: rounds up
    [2047 * 2 ** -11 + 2 ** -12, 0x3c00],   // rounding carries into the exponent
  ];
  for (const [x, want] of cases) assert.equal(f16Bits(x), want, `f16(${x})`);
  assert.equal(f16Bits(NaN) & 0x7c00, 0x7c00);
  assert.notEqual(f16Bits(NaN) & 0x3ff, 0);
});

test('packHalf2: element 2k in the low half of word k; odd lengths pad with 0', () => {
  const w = packHalf2(Float32Array.from([1, -2, 0.5]));
  assert.ok(w instanceof Uint32Array);
  assert.deepEqual(Array.from(w), [(0xc000 << 16 | 0x3c00) >>> 0, 0x3800]);
});
