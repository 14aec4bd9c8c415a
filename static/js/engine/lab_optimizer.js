// Lab entries for the optimizer (12_optimizer.wgsl through optimizer.js): plain arrays in, plain
// arrays out, so tests hold the kernels against torch.optim.AdamW and bitsandbytes' AdamW8bit.

import { readBuffer, storageBuffer } from './gpu.js';
import { Optimizer } from './optimizer.js';
import { mergeHyper } from './optimizer_hyper.js';

export function labEntries(ctx) {
  return {
    /**
     * One optimizer step per entry of `grads` (each Float32Array [total_numel]) starting from
     * `params` [total_numel] with zero state. `lr` is a number or one per step.
     * clip_mode 'global' | 'per_tensor' | 'off' (clip: false is 'off'); a hyperparameter left out
     * is the lab's optimizerDefaults (createLab: the server's, in a page).
     * Returns {params, grads (G after the last step), grad_norms, clip_scales, nonfinite,
     *          tensor_norm_sq, tensor_nonfinite, tensor_clip_scales ([steps][T] each), mirror?,
     *          state_bytes, dispatches, notes, state}; state is {m, v} (fp32 variants) or
     *          {codes, small, blocks, m32, v32, q_blocks} (8-bit variants, see 12_optimizer.wgsl).
     */
    async optimizerSteps({ variant = 'adamw', layout, params, grads, lr = 1e-3, beta1, beta2, eps,
      weight_decay, max_norm, clip, clip_mode, maps = null, lossScale = null,
      maxBindingBytes = null, tuning = {} }) {
      const { device } = ctx;
      const n = layout.total_numel;
      if (params.length !== n) throw new Error(`params has ${params.length} elements, layout ${n}`);
      const W = storageBuffer(device, n * 4, { label: 'lab.W', data: params });
      const G = storageBuffer(device, n * 4, { label: 'lab.G' });
      const is8 = variant.startsWith('adamw_8bit');
      const opt = await Optimizer.create(ctx, layout, {
        variant, W, G, maxBindingBytes, ...tuning,
        label: `lab.${variant}`,
        maps: is8 ? (maps || await ctx.getMaps()) : null,
        hyper: mergeHyper({ ...ctx.optimizerDefaults },
          { beta1, beta2, eps, weight_decay, max_norm, clip, clip_mode }), lossScale,
      });
      if (opt.mirror) opt.initMirror(params);
      const steps = grads.length;
      const sb = opt.statsBytes;
      const statsAll = storageBuffer(device, sb * steps, { label: 'lab.stats' });
      for (let s = 0; s < steps; s++) {
        if (grads[s].length !== n) throw new Error(`grads[${s}] has ${grads[s].length} elements`);
        device.queue.writeBuffer(G, 0, grads[s]);
        opt.setStep(s + 1, Array.isArray(lr) || ArrayBuffer.isView(lr) ? lr[s] : lr);
        const enc = device.createCommandEncoder();
        opt.encode(enc);
        enc.copyBufferToBuffer(opt.stats, 0, statsAll, sb * s, sb);
        device.queue.submit([enc.finish()]);
      }
      const stats = new Float32Array(await readBuffer(device, statsAll));
      const pick = (k) => Float32Array.from({ length: steps }, (_, s) => stats[sb / 4 * s + k]);
      const perTensor = (k) => Array.from({ length: steps }, (_, s) => Array.from(
        { length: opt.tensors }, (__, t) => stats[sb / 4 * s + 4 + 4 * t + k]));
      const out = {
        params: new Float32Array(await readBuffer(device, W)),
        grads: new Float32Array(await readBuffer(device, G)),
        grad_norms: pick(0), clip_scales: pick(1), nonfinite: pick(3),
        tensor_norm_sq: perTensor(0), tensor_nonfinite: perTensor(1), tensor_clip_scales: perTensor(2),
        state_bytes: opt.stateBytes, dispatches: opt.updateDispatches, notes: opt.notes,
      };
      if (opt.mirror) out.mirror = new Uint32Array(await readBuffer(device, opt.mirror, n * 2));
      if (lossScale) {
        const tail = 4 + 4 * opt.tensors;
        out.loss_scales = pick(tail);
        out.skipped = pick(tail + 1);
        out.scaler = new Float32Array(await readBuffer(device, opt.scaler));
      }
      if (is8) {
        out.state = {
          codes: new Uint32Array(await readBuffer(device, opt.codes)),
          small: new Float32Array(await readBuffer(device, opt.small)),
          blocks: opt.plan.entries, m32: opt.state8.m32, v32: opt.state8.v32, q_blocks: opt.plan.qBlocks,
        };
      } else {
        out.state = {
          m: new Float32Array(await readBuffer(device, opt.M)),
          v: new Float32Array(await readBuffer(device, opt.V)),
        };
      }
      for (const b of [W, G, statsAll]) b.destroy();
      opt.destroy();
      return out;
    },
  };
}
