// New-run page: pick preset, optimizer and hyperparameters; see the memory the choice needs on
// this GPU; start. The run's write token stays in this tab's sessionStorage, never in a URL.
import { acquireDevice } from '../engine/gpu.js';
import { activationBytes, limitProblems } from '../engine/model.js';

const $ = (id) => document.getElementById(id);
const form = $('new-run');
const MiB = (b) => `${(b / 2 ** 20).toFixed(1)} MiB`;
const layouts = new Map();
let limits = null;

async function json(url, init) {
  const res = await fetch(url, init);
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const detail = Array.isArray(body.detail)
      ? body.detail.map((d) => `${d.loc.slice(1).join('.') || 'config'}: ${d.msg}`).join('; ')
      : body.detail || res.statusText;
    throw new Error(detail);
  }
  return body;
}

/** The run config the form describes. Inputs, defaults and bounds are RunConfig's (the page
 *  is rendered from its schema); an empty optional number is left out: the server decides. */
function config() {
  const out = {};
  for (const el of form.elements) {
    if (!el.name || (el.type === 'radio' && !el.checked)) continue;
    if (el.type === 'checkbox') out[el.name] = el.checked;
    else if (el.value !== '') out[el.name] = el.type === 'number' ? Number(el.value) : el.value;
  }
  return out;
}

/** What the form's own limits refuse, in words ("Learning rate is required"). */
function problems() {
  return [...form.elements].filter((el) => el.name && !el.checkValidity()).map((el) => {
    const label = el.dataset.label ?? el.name;
    return el.validity.valueMissing ? `${label} is required` : `${label}: ${el.validationMessage}`;
  });
}

async function layoutOf(preset) {
  if (!layouts.has(preset)) layouts.set(preset, json(`/api/presets/${preset}/layout`));
  return layouts.get(preset);
}

/** Memory the choice needs, and whether this adapter can hold it. */
async function updateMemory() {
  const c = config();
  const layout = await layoutOf(c.preset);
  const T = layout.config.seq_len;
  const variant = c.optimizer;
  const opt = layout.optimizer_state[variant];
  const weights = layout.total_numel * 4;
  const mirror = c.f16_mirror ? layout.total_numel * 2 : 0;
  const B = c.batch_size ?? 0;
  const acts = activationBytes(layout.config, B, T).total;
  const total = 2 * weights + opt.state_bytes + mirror + acts;
  const rows = [
    ['parameters', `${(layout.n_params / 1e6).toFixed(2)} M`],
    ['weights + grads (f32)', MiB(2 * weights)],
    [`optimizer state (${variant === 'adamw' ? 'fp32 m, v' : '8-bit m, v'})`,
      `${MiB(opt.state_bytes)} (${opt.bytes_per_param} B/param)`],
    ...(mirror ? [['f16 weight mirror', MiB(mirror)]] : []),
    [`activations (batch ${B} x ${T})`, MiB(acts)],
    ['estimated GPU memory', MiB(total)],
  ];
  const gpuProblems = limits ? limitProblems(layout, B, T, limits) : [];
  $('memory').innerHTML = '';
  const table = document.createElement('table');
  for (const [k, v] of rows) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
  $('memory').append(table);
  $('memory').dataset.stateBytes = String(opt.state_bytes);
  if (!limits) {
    const p = document.createElement('p');
    p.className = 'error';
    p.textContent = 'WebGPU is not available in this browser: see Diagnostics.';
    $('memory').append(p);
  }
  for (const problem of gpuProblems) {
    const p = document.createElement('p');
    p.className = 'error';
    p.textContent = `This GPU cannot run it: ${problem}.`;
    $('memory').append(p);
  }
  $('start').disabled = !limits || gpuProblems.length > 0;
}

async function start(event) {
  event.preventDefault();
  $('form-error').hidden = true;
  const refused = problems();
  if (refused.length) {
    $('form-error').textContent = `Cannot start: ${refused.join('; ')}`;
    $('form-error').hidden = false;
    return;
  }
  $('start').disabled = true;
  try {
    const run = await json('/api/runs', { method: 'POST',
      headers: { 'content-type': 'application/json' }, body: JSON.stringify(config()) });
    sessionStorage.setItem(`andrea.run.${run.id}`, JSON.stringify({ token: run.token }));
    location.href = `/runs/${run.id}`;
  } catch (e) {
    $('form-error').textContent = `Cannot start: ${e.message}`;
    $('form-error').hidden = false;
    $('start').disabled = false;
  }
}

async function main() {
  const presets = await json('/api/presets');
  $('preset').replaceChildren(...presets.map((p) => new Option(
    `${p.name} (${(p.n_params / 1e6).toFixed(1)} M params, T ${p.config.seq_len})`, p.name)));
  try {
    ({ limits } = await acquireDevice(navigator.gpu));
  } catch {
    limits = null;
  }
  form.addEventListener('input', () => updateMemory().catch(console.error));
  form.addEventListener('submit', start);
  await updateMemory();
  document.body.dataset.ready = '1';
}

main();
