// A stand-in GPU and a Trainer whose model and optimizer are stubs: the real run() loop, its
// CheckpointCadence and snapshotSections run under Node, with no adapter (the lifecycle tests).
import { Trainer } from '../../static/js/engine/trainer.js';
import { RING, slotLayout } from '../../static/js/engine/step_record.js';

globalThis.GPUBufferUsage ??= { MAP_READ: 1, COPY_DST: 8, COPY_SRC: 4, QUERY_RESOLVE: 512 };
globalThis.GPUMapMode ??= { READ: 1 };

export const tick = (n = 1) => new Promise((r) => setTimeout(r, n));

/** A device whose mapAsync resolves after `mapDelay` ms (a function of the buffer label). */
export function fakeDevice({ mapDelay = () => 1 } = {}) {
  let loseIt;
  const dev = {
    features: new Set(),
    live: new Set(),
    lostFlag: false,
    submits: 0,
    lost: new Promise((r) => { loseIt = r; }),
    lose(reason = 'unknown', message = 'gone') { dev.lostFlag = true; loseIt({ reason, message }); },
    createBuffer({ label = '', size }) {
      const b = {
        label, size, mapped: false, destroyed: false,
        mapAsync() {
          if (dev.lostFlag) return Promise.reject(new Error('device lost'));
          return new Promise((res, rej) => setTimeout(() => {
            if (dev.lostFlag || b.destroyed) rej(new Error('device lost'));
            else { b.mapped = true; res(); }
          }, mapDelay(label)));
        },
        getMappedRange() { return new ArrayBuffer(size); },
        unmap() { b.mapped = false; },
        destroy() { b.destroyed = true; dev.live.delete(b); },
      };
      dev.live.add(b);
      return b;
    },
    createCommandEncoder() {
      return { copyBufferToBuffer() {}, resolveQuerySet() {}, finish() { return {}; } };
    },
    queue: { submit() { dev.submits++; }, writeBuffer() {} },
  };
  return dev;
}

export const config = (o = {}) => ({ steps: 40, lr: 1e-3, warmup_steps: 0, min_lr_ratio: 0.1,
  sample_every: 0, eval_every: 0, seed: 1, batch_size: 1, seq_len: 1, optimizer: 'adamw', ...o });

/** A Trainer wired to stand-ins, as build() would leave it (no Model/Optimizer on a GPU). */
export function makeTrainer({ device = fakeDevice(), cfg = config(), every = 10, on = {},
  resume = null, loadBatch } = {}) {
  const ctx = { device, limits: {} };
  const checkpoint = { sections: [{ name: 'W', bytes: 16 }], chunk_bytes: 16, every };
  const t = new Trainer({ ctx, layout: {}, config: cfg, on, checkpoint, resume,
    loadBatch: loadBatch ?? (async () => null) });
  const statsBytes = 16;
  t.model = { writeBatch() {}, encodeStep() {}, destroy() {} };
  t.opt = { setStep() {}, encode() {}, stats: {}, statsBytes, destroy() {},
    readStats: () => ({ grad_norm: 1, clip_scale: 1, nonfinite: 0, tensor_sq: [1] }) };
  t.sections = [{ name: 'W', buffer: device.createBuffer({ label: 'W', size: 16 }), bytes: 16, offset: 0 }];
  t.ckpt.start(resume ? resume.step : 0, Boolean(resume));
  if (resume) t.step = t.done = resume.step;
  t.B = 1; t.T = 1;
  t.plan = { acts: { losses: {} } };
  t.slot = slotLayout(statsBytes, 1);
  t.ring = [...Array(RING)].map((_, i) => ({ buf: device.createBuffer({ label: `readback${i}`,
    size: t.slot.bytes }), pending: null, mappedAt: 0 }));
  t.evalBuf = device.createBuffer({ label: 'eval', size: 4 });
  t.prefetch = { get: async () => ({ inputs: new Uint32Array(1), targets: new Uint32Array(1),
    sources: [0], phase: null }), jump() {} };
  return t;
}
