// Shape rules of the kernel launchers (kernels.js, ops.js, model.js): split-K of the weight
// gradient, tile choice, grids, scratch sizes, activation sizes and adapter limit checks.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gainPartialNumel } from '../../static/js/engine/kernels.js';
import { matmulLaunch, matmulShape, weightGradPartNumel, weightGradSplit } from '../../static/js/engine/matmul_tiles.js';
import { ropeTable } from '../../static/js/engine/rope.js';
import { tokenBuckets, tokenBucketsNumel } from '../../static/js/engine/token_buckets.js';
import { activationBytes, activationShapes, limitProblems } from '../../static/js/engine/model.js';
import { f32bits, grid1d, releaseOps, view } from '../../static/js/engine/ops.js';

test('weight-gradient split: rows a multiple of BK 16, splits cover M exactly once', () => {
  for (const [M, N, K] of [[37, 45, 19], [1000, 40, 24], [1000, 300, 230], [8192, 8192, 768],
    [64, 512, 64], [256, 64, 64], [100000, 7, 3]]) {
    const { splits, rows, tg, tile } = weightGradSplit(M, N, K);
    assert.equal(rows % 16, 0, `${M}x${N}x${K} rows ${rows}`);
    assert.ok(splits >= 1 && (splits - 1) * rows < M && splits * rows >= M, `${M}x${N}x${K}`);
    assert.equal(tile, 4 * tg);
    // Split rows never go under 256 (SPLIT_MIN_ROWS) unless there is one split.
    if (splits > 1) assert.ok(rows >= 256);
    assert.equal(weightGradPartNumel(M, N, K), splits > 1 ? splits * N * K : 0);
  }
});

test('weight-gradient split: the shapes tests/unit/gpu/test_kernels.py relies on', () => {
  // 32 x 32 tiles, three row ranges
  assert.deepEqual(weightGradSplit(1000, 40, 24), { splits: 3, rows: 336, tg: 8, tile: 32 });
  // past BIG_MATMUL (2^26 multiply-adds): 64 x 64 tiles
  const big = weightGradSplit(1000, 300, 230);
  assert.equal(big.tile, 64);
  assert.equal(big.splits, 3);
  // past WIDE_MATMUL (2^28): a weight gradient takes the 128 x 128 wide tile, here split 4 ways
  const wide = weightGradSplit(1031, 515, 509);
  assert.equal(wide.tile, 128);
  assert.equal(wide.splits, 4);
  // forward and input gradient: 64 x 128 below 256 tiles of 128 x 128, 128 x 128 from there
  // (17 x 17 tiles: test_kernels.py's (2049, 2050, 64) forward), and 64 x 128 on an adapter
  // without the bigger tile's workgroup memory
  assert.equal(matmulShape(1031, 515, 509).tile, 64);
  assert.equal(matmulShape(2049, 2050, 64).tile, 128);
  assert.equal(matmulShape(2049, 1900, 128).tile, 64);    // 17 x 15 tiles
  assert.equal(matmulShape(2049, 2050, 64, false).tile, 64);
  assert.equal(matmulShape(515, 509, 1031, false, true).tile, 64);
  // small problems: no split
  assert.equal(weightGradSplit(37, 45, 19).splits, 1);
});

test('tile choice depends on the problem size only', () => {
  assert.equal(weightGradSplit(2 ** 10, 2 ** 8, 2 ** 8 - 1).tg, 8);    // just under 2^26
  assert.equal(weightGradSplit(2 ** 10, 2 ** 8, 2 ** 8).tg, 16);       // exactly 2^26
});

test('a software adapter\'s direct matmul covers every output, in a grid WebGPU allows', () => {
  for (const [R, S] of [[37, 45], [5, 130], [2049, 2050], [1, 1], [1 << 16, 1 << 13]]) {
    const { entry, constants, groups } = matmulLaunch(R, S, 64, { software: true });
    assert.equal(entry, 'main_direct');
    // 8 x 8 outputs per thread (matmul_core.wgsl matmul_direct)
    assert.ok(groups[0] * groups[1] * constants.DWG * 64 >= Math.ceil(R / 8) * 8 * Math.ceil(S / 8) * 8,
      `${R} x ${S}: ${groups}`);
    assert.ok(groups.every((g) => g >= 1 && g <= 65535), `${R} x ${S}: ${groups}`);
  }
  // A GPU's launch is the tile policy's; the weight gradient's split asks no adapter.
  assert.equal(matmulLaunch(1031, 515, 509).entry, 'main_wide');
  assert.deepEqual(matmulLaunch(37, 45, 19).groups, [2, 2]);
});

test('norm-gain scratch: one partial row per 64 rows', () => {
  assert.equal(gainPartialNumel(64, 10), 10);
  assert.equal(gainPartialNumel(65, 10), 20);
  assert.equal(gainPartialNumel(1, 7), 7);
});

test('tokenBuckets: a stable counting sort of positions by token', () => {
  const tokens = Uint32Array.from([3, 0, 3, 5, 0, 3, 1]);
  const V = 7;
  const b = tokenBuckets(tokens, V);
  assert.equal(b.length, tokenBucketsNumel(tokens.length, V));
  // start[v] for v = 0..V, then positions of 0 (1, 4), 1 (6), 3 (0, 2, 5), 5 (3)
  assert.deepEqual(Array.from(b.subarray(0, V + 1)), [0, 2, 3, 3, 6, 6, 7, 7]);
  assert.deepEqual(Array.from(b.subarray(V + 1)), [1, 4, 6, 0, 2, 5, 3]);
  // Reusing the output array gives the same result for another batch (no stale counts).
  const again = tokenBuckets(Uint32Array.from([6, 6, 6, 6, 6, 6, 6]), V, b);
  assert.deepEqual(Array.from(again.subarray(0, V + 1)), [0, 0, 0, 0, 0, 0, 0, 7]);
  assert.deepEqual(Array.from(again.subarray(V + 1)), [0, 1, 2, 3, 4, 5, 6]);
  assert.throws(() => tokenBuckets(tokens, V, new Uint32Array(3)), /wrong out length/);
});

test('grid1d: 1-D up to 65535 workgroups, then 2-D covering at least n', () => {
  assert.deepEqual(grid1d(0), [1, 1]);
  assert.deepEqual(grid1d(65535), [65535, 1]);
  for (const n of [65536, 100000, 65535 * 3 + 1, 2 ** 24]) {
    const [x, y] = grid1d(n);
    assert.ok(x <= 65535 && y <= 65535 && x * y >= n && x * (y - 1) < n, `${n}: ${x} x ${y}`);
  }
});

test('f32bits and view', () => {
  assert.equal(f32bits(1), 0x3f800000);
  assert.equal(f32bits(-0), 0x80000000);
  assert.deepEqual(view({ size: 400 }, 10, 5), { buffer: { size: 400 }, offset: 40, size: 20 });
  assert.deepEqual(view({ size: 400 }, 10).size, 360);
});

test('releaseOps destroys each op\'s own buffers once', () => {
  let destroyed = 0;
  const buf = () => ({ destroy: () => { destroyed += 1; } });
  releaseOps([{ kind: 'dispatch', owned: [buf()] }, { kind: 'copy' }, { kind: 'dispatch', owned: [buf()] }]);
  assert.equal(destroyed, 2);
});

test('ropeTable: cos, sin of t * theta^(-2j/D), angles in f32', () => {
  const t = ropeTable(3, 4, 10000);
  assert.equal(t.length, 3 * 2 * 2);
  assert.deepEqual(Array.from(t.subarray(0, 4)), [1, 0, 1, 0]);   // t = 0
  assert.equal(t[(1 * 2 + 0) * 2], Math.fround(Math.cos(1)));      // t = 1, j = 0: angle 1
  assert.equal(t[(2 * 2 + 1) * 2 + 1], Math.fround(Math.sin(Math.fround(2 * Math.fround(1 / 100)))));
});

const tiny = {
  config: { vocab_size: 512, n_embd: 64, n_layer: 2, n_head: 4, ffn_dim: 192, seq_len: 64, head_dim: 16 },
  total_numel: 139584,
  limits: { max_head_dim: 128 },
};
const roomy = { maxStorageBufferBindingSize: 2 ** 30, maxBufferSize: 2 ** 30 };

test('activation shapes: layer counts and the largest buffer', () => {
  const shapes = Object.fromEntries(activationShapes(tiny.config, 2, 64).map(([n, e, l]) => [n, [e, l]]));
  assert.deepEqual(shapes.res, [2 * 64 * 64, 3]);              // L + 1 residual streams
  assert.deepEqual(shapes.logits, [2 * 64 * 512, null]);
  const { total, largest } = activationBytes(tiny.config, 2, 64);
  assert.equal(largest.name, 'logits');
  assert.equal(largest.bytes, 2 * 64 * 512 * 4);
  assert.ok(total > largest.bytes);
});

test('activation shapes: mixed attention keeps its dS in f16, half the fp32 kernels\' buffer', () => {
  const twelve = { vocab_size: 8192, n_embd: 384, n_layer: 6, n_head: 6, ffn_dim: 1024, seq_len: 256 };
  const ds = (mixed, T = 256) => activationShapes(twelve, 32, T, null, mixed).find(([n]) => n === 'attnDs')[1];
  assert.equal(ds(false), 32 * 6 * 256 * 256);            // [B, H, T, T] f32 (T a multiple of 4)
  assert.equal(ds(true), (32 * 6 * 256 * 256) / 2);      // the same in f16
  assert.equal(ds(true, 200), ds(false, 200));            // T not a multiple of 64: fp32 kernels
  assert.equal(ds(true, 64), 4);                          // below T 128 neither takes dS through memory
});

test('limitProblems: binding limits and the server\'s head-dim limit', () => {
  assert.deepEqual(limitProblems(tiny, 2, 64, roomy), []);
  const small = { maxStorageBufferBindingSize: 2 ** 18, maxBufferSize: 2 ** 30 };
  const p = limitProblems(tiny, 4, 64, small);
  assert.equal(p.length, 2);
  assert.match(p[0], /weights/);
  // In the new-run form's words: what the buffer holds, its product, the settings to lower
  // (the logits bind here: the loss takes them in chunks, tests/js/loss_chunks.test.mjs).
  assert.match(p[1], /^the FFN's gate and up projections \(batch size x context x 2 x FFN width\) at batch size 4 x context 64: /);
  assert.match(p[1], /: lower the batch size, the context or the FFN width$/);
  const wide = { ...tiny, config: { ...tiny.config, head_dim: 32 }, limits: { max_head_dim: 16 } };
  assert.deepEqual(limitProblems(wide, 2, 64, roomy), ['head dim over 16 is not supported']);
});
