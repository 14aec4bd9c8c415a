// /diagnostics: what WebGPU this browser offers, and whether compute actually works.
import { SHADER_BASE } from './assets.js';
import { createContext } from '../engine/context.js';
import { GPUUnavailableError } from '../engine/gpu.js';
import { fetchLoader } from '../engine/shaders.js';
import { runSelfTest } from '../engine/selftest.js';
import { fmtBytes, fmtValue } from './format.js';

const $ = (id) => document.getElementById(id);

/** A value for reading: times in ms to 2 decimals, byte limits in KiB/MiB/GiB (with the exact
 *  number), other numbers as they are (large ones grouped). */
function show(k, v) {
  if (v !== null && typeof v === 'object') return JSON.stringify(v);
  if (typeof v !== 'number') return String(v);
  if (/(^ms$|Ms$|_ms$)/.test(k)) return `${v.toFixed(2)} ms`;
  if (/Size$|Bytes|bytes/.test(k) && v >= 1024) return `${fmtBytes(v)} (${v.toLocaleString('en')})`;
  if (Number.isInteger(v)) return v.toLocaleString('en');
  return fmtValue(v);
}

function fillTable(table, obj) {
  table.replaceChildren(...Object.entries(obj).map(([k, v]) => {
    const tr = document.createElement('tr');
    for (const text of [k, show(k, v)]) {
      const td = document.createElement('td');
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  }));
}

/** Plain-words explanation of why WebGPU is unavailable here. */
export function explainUnavailable(reason, detail) {
  const lines = [];
  if (!window.isSecureContext) {
    lines.push('This page is not a secure context. WebGPU only works over https:// or from ' +
      'http://127.0.0.1 / http://localhost: open the app through one of those.');
  } else if (reason === 'no-webgpu') {
    lines.push('This browser does not expose WebGPU (navigator.gpu is missing).');
    lines.push('Use a recent Chrome or Chromium (113 or newer) or Edge.');
    lines.push('On Linux, Chrome still ships WebGPU behind flags: start it with ' +
      '--enable-unsafe-webgpu --enable-features=Vulkan (or enable chrome://flags/#enable-unsafe-webgpu).');
    lines.push('Without a GPU, Chromium can use its software (CPU) adapter, SwiftShader: start it ' +
      'with all three of --enable-unsafe-webgpu --enable-unsafe-swiftshader ' +
      '--use-webgpu-adapter=swiftshader (correct, but slow).');
  } else if (reason === 'no-adapter') {
    lines.push('WebGPU exists but no GPU adapter was offered: the GPU or its driver may be ' +
      'blocklisted, or no Vulkan/Metal/D3D12 driver is installed.');
    lines.push('Without a GPU, Chromium can use its software adapter (SwiftShader) when started ' +
      'with all three of --enable-unsafe-webgpu --enable-unsafe-swiftshader ' +
      '--use-webgpu-adapter=swiftshader; it is slow but correct.');
  } else {
    lines.push('The GPU device could not be created or failed its self-test.');
  }
  if (detail) lines.push(`Detail: ${detail}`);
  return lines;
}

async function main() {
  const status = $('status');
  const result = { adapter: null, features: [], limits: {}, selftest: null, reason: null };
  window.andreaDiagnostics = result;
  try {
    const gpu = window.isSecureContext ? navigator.gpu : undefined;
    const ctx = await createContext({ gpu, load: fetchLoader(SHADER_BASE),
      onError: (m) => console.error(m) });
    const { info, limits, software, errors } = ctx;
    const features = [...ctx.adapter.features].sort();   // what the adapter offers
    Object.assign(result, { adapter: { ...info, software }, features, limits });
    fillTable($('adapter'), { ...info, software });
    $('features').replaceChildren(...features.map((f) => {
      const li = document.createElement('li');
      li.textContent = f;
      return li;
    }));
    fillTable($('limits'), limits);
    $('details').hidden = false;
    result.selftest = await runSelfTest(ctx);
    fillTable($('selftest'), result.selftest);
    if (!result.selftest.passed || errors.length) {
      throw new GPUUnavailableError('selftest', `self-test failed ${JSON.stringify(result.selftest)} ${errors.join('; ')}`);
    }
    status.textContent = `WebGPU works: ${info.description || info.vendor || 'adapter'}` +
      (software ? ' (software adapter: correct but slow)' : '');
    status.className = 'status ok';
    document.body.dataset.webgpu = 'ok';
  } catch (e) {
    result.reason = e.reason || 'error';
    const explain = $('explain');
    explain.replaceChildren(...explainUnavailable(result.reason, e.message).map((t) => {
      const p = document.createElement('p');
      p.textContent = t;
      return p;
    }));
    explain.hidden = false;
    status.textContent = 'WebGPU is unavailable in this browser.';
    status.className = 'status bad';
    document.body.dataset.webgpu = 'unavailable';
  }
}

main();
