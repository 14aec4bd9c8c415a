// /lab: exposes the engine to tests as window.andrea.lab (see static/js/engine/README.md).
import { fetchJson, jsonBody } from './api.js';
import { SHADER_BASE } from './assets.js';
import { FACTS, routePath } from './facts.js';
import * as b64 from '../engine/b64.js';
import { createLab } from '../engine/lab.js';
import { fetchLoader } from '../engine/shaders.js';

async function getLayout({ preset, config }) {
  try {
    return await (preset ? fetchJson(routePath('get_preset_layout', { name: preset }))
      : fetchJson(routePath('layout_for_config'), jsonBody('POST', config)));
  } catch (e) {
    throw new Error(`layout request failed: ${e.status ? `${e.status} ` : ''}${e.message}`);
  }
}

try {
  const lab = await createLab({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE), getLayout,
    getMaps: () => fetchJson(routePath('optimizer_maps')), optimizerDefaults: FACTS.optimizer_defaults });
  window.andrea = { lab, b64 };
  document.getElementById('status').textContent =
    `Lab ready on ${lab.info.adapter.vendor} ${lab.info.adapter.architecture}`;
  document.body.dataset.lab = 'ready';
} catch (e) {
  document.getElementById('status').textContent = `Lab failed: ${e.message}`;
  document.body.dataset.lab = 'error';
  throw e;
}
