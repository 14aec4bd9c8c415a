// A small compute self-test: elementwise op, workgroup memory and a tree reduction,
// checked against exact CPU arithmetic (all values are small integers, exact in f32).

import { readBuffer, storageBuffer } from './gpu.js';
import { bindGroup } from './shaders.js';

/** ctx: the engine context (context.js); n elements in workgroups of wg threads. */
export async function runSelfTest({ device, lib }, n = 1000, wg = 64) {
  const t0 = performance.now();
  const p = await lib.pipeline('00_selftest.wgsl', 'main', { WG: wg });
  const x = Float32Array.from({ length: n }, (_, i) => i % 97);
  const nwg = Math.ceil(n / wg);
  const bx = storageBuffer(device, x.byteLength, { data: x, label: 'selftest.x' });
  const bout = storageBuffer(device, x.byteLength, { label: 'selftest.out' });
  const bsums = storageBuffer(device, nwg * 4, { label: 'selftest.sums' });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(p.pipeline);
  pass.setBindGroup(0, bindGroup(device, p, { x: bx, out: bout, sums: bsums }));
  pass.dispatchWorkgroups(nwg);
  pass.end();
  device.queue.submit([enc.finish()]);
  const out = new Float32Array(await readBuffer(device, bout));
  const sums = new Float32Array(await readBuffer(device, bsums));
  let maxError = 0;
  for (let i = 0; i < n; i++) maxError = Math.max(maxError, Math.abs(out[i] - (2 * x[i] + 1)));
  let sumErrors = 0;
  for (let w = 0; w < nwg; w++) {
    let s = 0;
    for (let i = w * wg; i < Math.min(n, (w + 1) * wg); i++) s += x[i];
    if (sums[w] !== s) sumErrors++;
  }
  for (const b of [bx, bout, bsums]) b.destroy();
  return { n, workgroups: nwg, maxError, sumErrors, sample: Array.from(out.slice(0, 4)),
    passed: maxError === 0 && sumErrors === 0, ms: performance.now() - t0 };
}
