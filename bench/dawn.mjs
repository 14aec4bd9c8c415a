// The engine context under Node + Dawn for the benchmarks: Dawn's WebGPU from $DAWN_NODE (see
// gpu/README.md), its globals (GPUBufferUsage, ...) installed, shaders read from the checkout.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
// Dawn's instance must outlive every device made from it (a collected instance crashes the
// process), so the module keeps it.
const instances = [];

/** createContext() on Dawn; exactTimestamps switches off Dawn's timestamp quantization. */
export async function dawnContext({ exactTimestamps = false } = {}) {
  if (!process.env.DAWN_NODE) throw new Error('set DAWN_NODE to Dawn\'s dawn.node (bench/gpu/README.md)');
  const { create, globals } = createRequire(import.meta.url)(process.env.DAWN_NODE);
  Object.assign(globalThis, globals);
  const gpu = create(['enable-dawn-features=allow_unsafe_apis',
    ...(exactTimestamps ? ['disable-dawn-features=timestamp_quantization'] : [])]);
  instances.push(gpu);
  const { createContext } = await import(`${repo}/static/js/engine/context.js`);
  return createContext({ gpu,
    load: async (f) => fs.readFileSync(path.join(repo, 'shaders', f), 'utf8'),
    onError: (m) => { console.error('GPU error:', m); process.exitCode = 1; } });
}

/** Mean ms of a training step (forward, backward, optimizer: one encoder, one submit) over `n`
 *  steps submitted back to back after 3 warm-up steps, on the batch already in `plan`. */
export async function backToBackMs({ model, optim, plan }, n) {
  const { device } = model;
  const step = (s) => {
    optim.setStep(s, 1e-4);
    const enc = device.createCommandEncoder();
    model.encodeStep(enc, plan);
    optim.encode(enc);
    device.queue.submit([enc.finish()]);
  };
  for (let s = 1; s <= 3; s++) step(s);
  await device.queue.onSubmittedWorkDone();
  const t0 = performance.now();
  for (let s = 4; s < 4 + n; s++) step(s);
  await device.queue.onSubmittedWorkDone();
  return (performance.now() - t0) / n;
}
