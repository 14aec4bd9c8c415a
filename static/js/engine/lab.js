// The lab: the engine's test surface (window.andrea.lab in /lab, or directly under Node).
// Every entry takes plain typed arrays and returns plain typed arrays, so tests can compare
// against PyTorch without knowing about GPU buffers. See README.md beside this file.

import { createContext } from './context.js';

import * as modelLab from './lab_model.js';
import * as optimizerLab from './lab_optimizer.js';

const LAB_MODULES = [modelLab, optimizerLab];

/**
 * gpu: navigator.gpu or Dawn's gpu object; load: (file) => WGSL source;
 * getLayout: ({preset} | {config}) => layout JSON from the server (server/model.py).
 */
export async function createLab({ gpu, load, getLayout }) {
  const ctx = await createContext({ gpu, load });
  ctx.getLayout = getLayout;
  // What the server says the kernels support (server/model.py), for kernels run without a model.
  ctx.modelLimits = (await getLayout({ preset: 'tiny' })).limits;
  const lab = {
    ctx,
    info: { adapter: ctx.info, features: ctx.features, limits: ctx.limits, software: ctx.software },
  };
  // Each engine area adds its entries (labEntries(ctx) -> {name: async fn}).
  for (const m of LAB_MODULES) Object.assign(lab, m.labEntries(ctx));
  return lab;
}
