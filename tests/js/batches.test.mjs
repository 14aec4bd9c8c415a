// The batch wire format: batches.js parses the golden body that server/data/wire.py writes
// (tests/api/test_data_batches.py checks wire.py still writes exactly these bytes).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { GOLDEN } from './paths.mjs';
import { Prefetcher, parseBatch } from '../../static/js/engine/batches.js';

const spec = JSON.parse(fs.readFileSync(path.join(GOLDEN, 'batch_wire.json'), 'utf8'));
const bytes = fs.readFileSync(path.join(GOLDEN, 'batch_wire.bin'));
// A fresh ArrayBuffer of exactly the body, as fetch().arrayBuffer() gives it.
const body = () => bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);

test('parseBatch reads the golden body into the described batch', () => {
  const b = parseBatch(body());
  assert.equal(b.B, spec.B);
  assert.equal(b.T, spec.T);
  assert.equal(b.step, spec.step);
  assert.equal(b.split, spec.split);
  assert.equal(b.phase, spec.phase);
  assert.deepEqual(Array.from(b.sources), spec.sources);
  assert.ok(b.inputs instanceof Uint32Array && b.targets instanceof Uint32Array);
  // inputs = row[:T], targets = row[1:], each [B, T] row-major
  assert.deepEqual(Array.from(b.inputs), spec.tokens.flatMap((row) => row.slice(0, spec.T)));
  assert.deepEqual(Array.from(b.targets), spec.tokens.flatMap((row) => row.slice(1)));
});

test('parseBatch: no phase, train split', () => {
  const buf = body();
  const u = new DataView(buf);
  u.setUint32(32, 0xffffffff, true);   // phase: none
  u.setUint32(20, 0, true);            // split: train
  const b = parseBatch(buf);
  assert.equal(b.phase, null);
  assert.equal(b.split, 'train');
});

test('parseBatch refuses other magic, versions and token widths', () => {
  for (const [offset, value, words] of [[0, 0x21212121, /magic/], [4, 2, /version 2/],
    [24, 2, /2 bytes/]]) {
    const buf = body();
    new DataView(buf).setUint32(offset, value, true);
    assert.throws(() => parseBatch(buf), words);
  }
});

test('Prefetcher keeps `depth` batches in flight and stops at the end', async () => {
  const asked = [];
  const p = new Prefetcher(async (step) => { asked.push(step); return body(); }, { depth: 2, end: 3 });
  const b = await p.get(0);
  assert.equal(b.step, spec.step);
  assert.deepEqual(asked, [0, 1, 2]);
  await p.get(1);
  assert.deepEqual(asked, [0, 1, 2]);   // step 3 is past the end
});
