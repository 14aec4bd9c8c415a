// The loss's chunks of rows (model.js lossChunkRows, lossChunks): one chunk wherever the [N, V]
// logits bind, else the fewest that do, aligned; and what the plan's sizes and the adapter
// checks make of them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { weightGradPartNumel } from '../../static/js/engine/matmul_tiles.js';
import { activationBytes, activationShapes, limitProblems, lossChunkRows, lossChunks }
  from '../../static/js/engine/model.js';

const MiB = 2 ** 20;
const limits = (bind) => ({ maxStorageBufferBindingSize: bind, maxBufferSize: 2 ** 40 });
const twelve = {
  config: { vocab_size: 8192, n_embd: 384, n_layer: 6, n_head: 6, ffn_dim: 1024, seq_len: 256, head_dim: 64 },
  total_numel: 7_000_000,
  limits: { max_head_dim: 128 },
};
const shape = (config, B, T, lim, name, rows) => activationShapes(config, B, T, lim, false, rows)
  .find(([n]) => n === name)[1];

test('one chunk wherever the logits bind, or without limits', () => {
  assert.equal(lossChunkRows(8192, 8192, null), 8192);
  assert.equal(lossChunkRows(8192, 8192, limits(256 * MiB)), 8192);        // exactly the limit
  assert.equal(lossChunkRows(100, 515, limits(100 * 515 * 4)), 100);       // any N, aligned or not
  assert.deepEqual(lossChunks(100, 100), [[0, 100]]);
  assert.deepEqual(lossChunks(0, 0), []);
});

test('over the limit: the fewest chunks that bind, equal, of a multiple of 64 rows', () => {
  for (const [N, V, bind] of [[65536, 8192, 2 ** 31 - 4], [131072, 8192, 2 ** 31 - 4],
    [256 * 1024, 8192, 2 ** 31], [1000, 515, 300_000], [8192 + 64, 8192, 256 * MiB],
    [5000, 777, 64 * 777 * 4]]) {
    const rows = lossChunkRows(N, V, limits(bind));
    const chunks = lossChunks(N, rows);
    const most = Math.floor(bind / (4 * V * 64)) * 64;   // aligned rows that bind, by hand
    assert.equal(rows % 64, 0, `${N} ${V} ${bind}`);
    assert.ok(rows * V * 4 <= bind, `${N} ${V} ${bind}: ${rows} rows do not bind`);
    assert.equal(chunks.length, Math.ceil(N / most), `${N} ${V} ${bind}: not the fewest`);
    // Chunks tile [0, N) in order; all but the last hold `rows`, the last at most that.
    let next = 0;
    for (const [r0, n] of chunks) {
      assert.equal(r0, next);
      assert.ok(n >= 1 && n <= rows);
      next += n;
    }
    assert.equal(next, N);
    assert.ok(chunks.slice(0, -1).every(([, n]) => n === rows));
  }
  // 12m at batch 256 on a 2 GiB adapter: two chunks of 32768 rows, 1 GiB of logits each.
  assert.equal(lossChunkRows(256 * 256, 8192, limits(2 ** 31 - 4)), 32768);
  // As equal as the 64-row alignment allows: three chunks, the last 64 rows short.
  assert.deepEqual(lossChunks(131072, lossChunkRows(131072, 8192, limits(2 ** 31 - 4))).map(([, n]) => n),
    [43712, 43712, 43648]);
});

test('the plan sizes the logits and the lm head\'s split-K partials for one chunk', () => {
  const lim = limits(2 ** 31 - 4);
  const { config } = twelve;
  const V = config.vocab_size;
  const C = config.n_embd;
  assert.equal(shape(config, 256, 256, lim, 'logits'), 32768 * V);
  assert.equal(shape(config, 32, 256, lim, 'logits'), 8192 * V);              // binds: [N, V] as ever
  assert.equal(shape(config, 256, 256, null, 'logits'), 65536 * V);           // no limits: one chunk
  assert.equal(shape(config, 2, 256, lim, 'logits', 192), 192 * V);           // rows given
  // wgradPart holds the largest split of the five weight gradients, the lm head's over a chunk.
  const others = [[C, 1024], [2048, C], [C, C], [3 * C, C]].map(([n, k]) => weightGradPartNumel(256 * 256, n, k));
  assert.equal(shape(config, 256, 256, lim, 'wgradPart'),
    Math.max(1, weightGradPartNumel(32768, V, C), ...others));
  // Two sizes of chunk (512 rows at 192: 192, 192, 128): the larger need of the two.
  assert.equal(shape(config, 2, 256, lim, 'wgradPart', 192), Math.max(1, weightGradPartNumel(192, V, C),
    weightGradPartNumel(128, V, C), ...[[C, 1024], [2048, C], [C, C], [3 * C, C]].map(([n, k]) => weightGradPartNumel(512, n, k))));
});

test('12m at batch 256: the logits no longer refuse a 2 GiB adapter, and the estimate shrinks', () => {
  const lim = limits(2 ** 31 - 4);
  assert.deepEqual(limitProblems(twelve, 256, 256, lim), []);
  const chunked = activationBytes(twelve.config, 256, 256, lim);
  const whole = activationBytes(twelve.config, 256, 256, null);
  assert.equal(whole.total - chunked.total, 32768 * 8192 * 4);   // half the [N, V] logits
  assert.ok(chunked.largest.bytes <= 2 ** 31 - 4);
});

test('limitProblems names the logits only where the smallest chunk does not bind', () => {
  const config = { ...twelve.config, vocab_size: 2 ** 16 };
  const small = limits(8 * MiB);   // 64 rows of 65536 logits: 16 MiB
  const layout = { ...twelve, config, total_numel: 1_000_000 };
  const p = limitProblems(layout, 1, 64, small);
  assert.ok(p.some((m) => /^the logits of the loss's smallest chunk \(64 positions x vocabulary\) at batch size 1 x context 64: one 16 MiB buffer, .*: lower the vocabulary$/.test(m)), p.join('\n'));
});

test('lossRows must be a multiple of 64', async () => {
  const { Model } = await import('../../static/js/engine/model.js');
  const ctx = { device: {}, lib: {}, limits: null };
  for (const lossRows of [0, 32, 100, 64.5]) {
    assert.throws(() => new Model(ctx, { config: twelve.config, params: [], total_numel: 0,
      limits: twelve.limits }, { lossRows }), /lossRows must be a positive multiple of 64/);
  }
});
