// The lab: the engine's test surface (window.andrea.lab in /lab, or directly under Node).
// Every entry takes plain typed arrays and returns plain typed arrays, so tests can compare
// against PyTorch without knowing about GPU buffers. See README.md beside this file.

import { createContext } from './context.js';

import * as modelLab from './lab_model.js';
import * as optimizerLab from './lab_optimizer.js';
import * as roomLab from './lab_room.js';

const LAB_MODULES = [modelLab, optimizerLab, roomLab];

/**
 * gpu: navigator.gpu or Dawn's gpu object; load: (file) => WGSL source;
 * getLayout: ({preset} | {config}) => layout JSON from the server (server/model.py);
 * getMaps: () => the 8-bit quantization maps (server/optim.py quantization_maps()), for an
 * 8-bit optimizer entry whose caller passes none;
 * optimizerDefaults: the hyperparameters an optimizer entry's caller may leave out (a page
 * passes the server's, RunConfig's: page facts).
 */
export async function createLab({ gpu, load, getLayout, getMaps = null, optimizerDefaults = {} }) {
  // The mixed-precision kernels' features where the adapter has them (lab.info.mixed says
  // whether they can run); the fp32 kernels use neither.
  const ctx = await createContext({ gpu, load, mixed: 'optional' });
  ctx.getLayout = getLayout;
  ctx.getMaps = getMaps ?? (() => { throw new Error('pass `maps` (server/optim.py quantization_maps())'); });
  ctx.optimizerDefaults = optimizerDefaults;
  // What the server says the kernels support (server/model.py), for kernels run without a model.
  ctx.modelLimits = (await getLayout({ preset: 'tiny' })).limits;
  const lab = {
    ctx,
    info: { adapter: ctx.info, features: ctx.features, limits: ctx.limits, software: ctx.software,
      mixed: ctx.mixed },
  };
  // Each engine area adds its entries (labEntries(ctx) -> {name: async fn}).
  for (const m of LAB_MODULES) Object.assign(lab, m.labEntries(ctx));
  return lab;
}
