// The mixed-precision matmul's shape rules and generated WGSL (mma.js, kernels.js): which shapes
// it takes, its split-K and scratch, and the source it emits for each operand layout. Its results
// are checked on a GPU with f16 subgroup matrices (bench/bench_matmul_f16.mjs: against the exact
// product; bench/bench_mixed_parity.mjs: a whole backward against fp32); SwiftShader has none.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { weightGradPartNumel } from '../../static/js/engine/matmul_tiles.js';
import { mmaGemm, mmaSplit, mmaTile } from '../../static/js/engine/mma_ops.js';
import { MMA_TILE, mixedSupport, mmaPlan, mmaShader } from '../../static/js/engine/mma.js';

test('mma: the engine tile is 128 x 128 x 32 in 4 subgroups and fits 32 KiB of workgroup memory', () => {
  for (const [aT, bT] of [[0, 1], [0, 0], [1, 0]]) {
    const p = mmaPlan({ ...MMA_TILE, aT, bT });
    assert.deepEqual([p.BM, p.BN, p.bk, p.threads], [128, 128, 32, 128]);
    assert.ok(p.bytes <= 32768, `${aT}${bT}: ${p.bytes} B`);
  }
});

test('mma: shapes that fill its tiles, and a split-K that covers the reduction once', () => {
  assert.equal(mmaSplit(8192, 2304, 768).fits, true);
  assert.equal(mmaSplit(8192, 2304, 768).splits, 1);       // 1152 blocks: no split
  assert.equal(mmaSplit(8192, 2300, 768).fits, false);      // 2300 is no multiple of 16: fp32
  assert.equal(mmaSplit(8192, 2304, 760).fits, false);      // nor 760 of 16
  for (const [R, S, INNER] of [[768, 768, 8192], [384, 384, 8192], [2304, 768, 8192], [384, 1024, 8192]]) {
    const { fits, splits, KS } = mmaSplit(R, S, INNER);
    assert.ok(fits && splits > 1, `${R}x${S}x${INNER}`);
    assert.equal(KS % 32, 0);
    assert.ok((splits - 1) * KS < INNER && splits * KS >= INNER);
    assert.ok(KS >= 512);
    // dW[N, K] over M rows is C[R = N, S = K] over INNER = M: the scratch holds every slab.
    assert.ok(weightGradPartNumel(INNER, R, S, true) >= splits * R * S);
  }
  assert.equal(mmaSplit(384, 384, 8192, false).splits, 1);   // no scratch: no split
  // fp32 scratch is unchanged by the mixed option's existence.
  assert.equal(weightGradPartNumel(8192, 384, 384), weightGradPartNumel(8192, 384, 384, false));
});

test('mma: shapes the engine tile does not fill take the largest smaller tile that does', () => {
  const side = (t) => [t.sgm * t.tm * 16, t.sgn * t.tn * 16, t.bk];
  assert.equal(mmaTile(8192, 2304, 768), MMA_TILE);           // 120m: the engine tile, as before
  assert.deepEqual(side(mmaTile(256, 192, 64)), [128, 64, 32]);   // tiny's q|k|v, B 4
  assert.deepEqual(side(mmaTile(64, 512, 32)), [64, 128, 32]);    // a head, B 2 T 32
  assert.deepEqual(side(mmaTile(48, 80, 112)), [16, 16, 16]);     // custom: multiples of 16 only
  assert.equal(mmaTile(100, 64, 64), null);                   // B 2 T 50: fp32
  // tiny's and the export test's custom shape's (48 wide, FFN 96) every matmul, B 2 to 8, all
  // three GEMMs of each: a tile, whose WGSL generates for every layout and input.
  for (const [C, F, V] of [[64, 192, 512], [48, 96, 1024], [32, 128, 512]]) {
    for (const M of [2 * 32, 2 * 64, 8 * 64]) {
      for (const [N, K] of [[3 * C, C], [C, C], [2 * F, C], [C, F], [V, C]]) {
        for (const kind of ['fwd', 'dx', 'dW']) {
          const g = mmaGemm(kind, M, N, K);
          const t = mmaTile(g.R, g.S, g.INNER);
          assert.ok(t, `${kind} ${M}x${N}x${K}`);
          const p = mmaPlan({ ...t, aT: g.aT, bT: g.bT });
          assert.equal(g.R % p.BM + g.S % p.BN + g.INNER % p.bk, 0);
          for (const bIn of ['f32', 'f16']) assert.ok(mmaShader({ ...t, aT: g.aT, bT: g.bT, bIn }));
        }
      }
    }
  }
});

test('mma: each layout loads its fragments with the majorness its slices are stored in', () => {
  const tmpl = mmaShader({ ...MMA_TILE, aT: 1, bT: 0, accum: true, bIn: 'f16' });
  assert.match(tmpl, /enable chromium_experimental_subgroup_matrix;/);
  assert.match(tmpl, /subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, col_major>\(&sa,/);
  assert.match(tmpl, /subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>\(&sb,/);
  assert.match(tmpl, /var c0_0 = subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>, row_major>\(&c,/);
  assert.match(tmpl, /var<storage, read> b: array<vec4<u32>>/);   // the f16 mirror, 8 halves a load
  assert.equal((tmpl.match(/subgroupMatrixMultiplyAccumulate/g) ?? []).length, 2 * 16);
  const old = mmaShader({ ...MMA_TILE, aT: 0, bT: 1, syntax: 'bool' });
  assert.match(old, /subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>\(&sa, [^;]*, false, 40u\)/);
  assert.match(old, /subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>\(&sb, [^;]*, true, 40u\)/);
  assert.match(old, /var c0_0 = subgroup_matrix_result<f32, 16, 16>\(\);/);
  assert.match(old, /subgroupMatrixStore\(&c, [^;]*, c3_3, false, dims.N\);/);
});

test('mma: mixedSupport names what an adapter lacks', () => {
  const cfg = { componentType: 'f16', resultComponentType: 'f32', M: 16, N: 16, K: 16 };
  const ctx = (features, info, wg = 32768) => ({ features, adapter: { info },
    limits: { maxComputeWorkgroupStorageSize: wg } });
  const all = ['shader-f16', 'chromium-experimental-subgroup-matrix'];
  const h200 = { subgroupMatrixConfigs: [cfg], subgroupMinSize: 32, subgroupMaxSize: 32 };
  assert.deepEqual(mixedSupport(ctx(all, h200)), { ok: true, why: '' });
  assert.match(mixedSupport(ctx(['timestamp-query'], {})).why, /no shader-f16; no chromium-experimental/);
  assert.match(mixedSupport(ctx(all, { ...h200, subgroupMatrixConfigs: [{ ...cfg, resultComponentType: 'f16' }] })).why,
    /no f16 x f16 -> f32/);
  assert.match(mixedSupport(ctx(all, { ...h200, subgroupMinSize: 16 })).why, /subgroups of 16-32/);
  assert.match(mixedSupport(ctx(all, h200, 16384)).why, /16384 B of workgroup memory, the tile needs/);
});
