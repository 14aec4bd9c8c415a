// Per-kernel GPU times with timestamp-query: each dispatch in its own pass with
// timestampWrites (begin, end). Profiling only; the training step keeps one pass.

import { readBuffer } from './gpu.js';
import { encodeCopy, encodeDispatch } from './ops.js';

/** Run `ops` once with a timestamp pair around every dispatch; resolves to
 *  [{label, ms}] in op order (copies are listed with ms null), or null without the feature. */
export async function profileOps(device, ops) {
  if (!device.features.has('timestamp-query')) return null;
  const dispatches = ops.filter((op) => op.kind === 'dispatch');
  const count = dispatches.length * 2;
  const querySet = device.createQuerySet({ type: 'timestamp', count });
  const resolve = device.createBuffer({ size: count * 8,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
  const enc = device.createCommandEncoder();
  let q = 0;
  for (const op of ops) {
    if (op.kind === 'dispatch') {
      const pass = enc.beginComputePass({ timestampWrites: { querySet,
        beginningOfPassWriteIndex: q, endOfPassWriteIndex: q + 1 } });
      q += 2;
      encodeDispatch(pass, op);
      pass.end();
    } else {
      encodeCopy(enc, op);
    }
  }
  enc.resolveQuerySet(querySet, 0, count, resolve, 0);
  device.queue.submit([enc.finish()]);
  const ns = new BigUint64Array(await readBuffer(device, resolve));
  querySet.destroy();
  resolve.destroy();
  let i = 0;
  return ops.map((op) => {
    if (op.kind !== 'dispatch') return { label: op.label, ms: null };
    const ms = Number(ns[i + 1] - ns[i]) / 1e6;
    i += 2;
    return { label: op.label, file: op.file, entry: op.entry, ms };
  });
}

/** Sum per label: [{label, file, entry, calls, ms}] sorted by time. */
export function summarize(profile) {
  const by = new Map();
  for (const { label, file, entry, ms } of profile) {
    if (ms === null) continue;
    const e = by.get(label) ?? { label, file, entry, calls: 0, ms: 0 };
    e.calls += 1;
    e.ms += ms;
    by.set(label, e);
  }
  return [...by.values()].sort((a, b) => b.ms - a.ms);
}
