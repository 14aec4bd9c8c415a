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

// server/run_config.py MIXED_DAWN_TOGGLES (a bench runs where no server is; tests/api/test_page_facts.py
// holds the two equal).
const MIXED_DAWN_TOGGLES = ['allow_unsafe_apis', 'vulkan_enable_f16_on_nvidia'];

/** createContext() on Dawn; exactTimestamps switches off Dawn's timestamp quantization, `toggles`
 *  are more Dawn toggles to enable (e.g. disable_robustness). Dawn's vulkan_enable_f16_on_nvidia
 *  is always on (NVIDIA's Vulkan driver then offers shader-f16 and f16 subgroup matrices; it
 *  changes nothing elsewhere); mixed: the device must have what mixed precision needs (mma.js). */
export async function dawnContext({ exactTimestamps = false, toggles = [], mixed = false } = {}) {
  if (!process.env.DAWN_NODE) throw new Error('set DAWN_NODE to Dawn\'s dawn.node (bench/gpu/README.md)');
  const { create, globals } = createRequire(import.meta.url)(process.env.DAWN_NODE);
  Object.assign(globalThis, globals);
  const gpu = create([['enable-dawn-features=' + MIXED_DAWN_TOGGLES.join(','), ...toggles].join(','),
    ...(exactTimestamps ? ['disable-dawn-features=timestamp_quantization'] : [])]);
  instances.push(gpu);
  const { createContext } = await import(`${repo}/static/js/engine/context.js`);
  return createContext({ gpu, mixed: mixed ? 'required' : false,
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

/** Median GPU ms of each candidate (a list of dispatch ops, times summed over them), from
 *  timestamp queries around each dispatch. The candidates run round-robin in one submission
 *  after ~200 ms of untimed rounds, so that all of them see the same ramped-up clocks. */
export async function timeCandidates(device, cands, iters) {
  const { encodeDispatch } = await import(`${repo}/static/js/engine/ops.js`);
  const { readBuffer } = await import(`${repo}/static/js/engine/gpu.js`);
  const encodeRound = (enc, qs, q) => {
    for (const ops of cands) {
      for (const op of ops) {
        const pass = qs ? enc.beginComputePass({ timestampWrites: { querySet: qs,
          beginningOfPassWriteIndex: q, endOfPassWriteIndex: q + 1 } }) : enc.beginComputePass();
        if (qs) q += 2;
        encodeDispatch(pass, op);
        pass.end();
      }
    }
    return q;
  };
  const timeAll = async (warm, rounds) => {
    const count = 2 * rounds * cands.reduce((a, c) => a + c.length, 0);
    const qs = device.createQuerySet({ type: 'timestamp', count });
    const res = device.createBuffer({ size: 8 * count,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
    const enc = device.createCommandEncoder();
    for (let w = 0; w < warm; w++) encodeRound(enc, null, 0);
    let q = 0;
    for (let it = 0; it < rounds; it++) q = encodeRound(enc, qs, q);
    enc.resolveQuerySet(qs, 0, count, res, 0);
    device.queue.submit([enc.finish()]);
    const ns = new BigUint64Array(await readBuffer(device, res));
    qs.destroy();
    res.destroy();
    const per = cands.map(() => []);
    let b = 0;
    for (let it = 0; it < rounds; it++) {
      cands.forEach((ops, c) => {
        let t = 0;
        for (let j = 0; j < ops.length; j++, b += 2) t += Number(ns[b + 1] - ns[b]) / 1e6;
        per[c].push(t);
      });
    }
    return per.map((p) => p.sort((x, y) => x - y)[Math.floor(p.length / 2)]);
  };
  const first = await timeAll(0, 1);
  const round = first.reduce((a, x) => a + x, 0);
  return timeAll(Math.max(2, Math.ceil(200 / round)), iters);
}
