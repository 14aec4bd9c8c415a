// Kernels page: profile one training step on this GPU and read each kernel's WGSL beside its time.
import { fetchJson } from './api.js';
import { SHADER_BASE } from './assets.js';
import { FACTS, routePath } from './facts.js';
import { createContext } from '../engine/context.js';
import { createModel } from '../engine/model.js';
import { Optimizer } from '../engine/optimizer.js';
import { profileOps, summarize } from '../engine/profiler.js';
import { fetchLoader } from '../engine/shaders.js';

const $ = (id) => document.getElementById(id);
const state = {
  ctx: null,                // the engine context (createContext)
  // {key, model, plan}: reused while preset and batch stay, destroyed when either changes, so
  // repeated clicks hold one model and one plan at most.
  held: null,
};

/** Model and plan of `preset` at batch B: the ones already built, or new ones. */
async function planFor(preset, B) {
  const key = `${preset}/${B}`;
  if (state.held?.key === key) return state.held;
  state.held?.model.destroy();
  state.held = null;
  const layout = await fetchJson(routePath('get_preset_layout', { name: preset }));
  const model = await createModel(state.ctx, layout, { seed: 0 });
  try {
    state.held = { key, model, plan: await model.plan(B, layout.config.seq_len) };
  } catch (e) {
    model.destroy();
    throw e;
  }
  return state.held;
}

/** The WGSL kernel `file` was compiled from (its includes expanded; one made in JS and defined in
 *  the library, such as attention_direct.js's, as made), or the JS module that makes it. */
async function showSource(file, entry) {
  $('source-title').textContent = `${file}${entry && entry !== 'main' ? ` (entry point ${entry})` : ''}`;
  $('source').textContent = state.ctx.lib.knows(file) ? await state.ctx.lib.code(file)
    : `// WGSL made in JS for this shape and adapter by static/js/engine/${file}`;
}

async function profile(event) {
  event?.preventDefault();
  $('run').disabled = true;
  $('status').textContent = 'Compiling and profiling…';
  try {
    const preset = $('preset').value;
    const B = Number($('batch').value);
    const { model, plan } = await planFor(preset, B);
    const { layout } = model;
    const T = plan.T;
    const V = layout.config.vocab_size;
    model.writeBatch(plan, Uint32Array.from({ length: B * T }, (_, i) => (i * 7919) % V),
      Uint32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % V));
    const ops = [...plan.forward, ...plan.loss, ...plan.backward];
    await profileOps(state.ctx.device, ops);               // warm-up
    const rows = summarize(await profileOps(state.ctx.device, ops));
    const variant = $('optimizer').value;
    if (variant) rows.push(...await profileOptimizer(model, variant));
    const total = rows.reduce((a, r) => a + r.ms, 0);
    $('kernels').querySelector('tbody').replaceChildren(...rows.sort((a, b) => b.ms - a.ms).map((r) => {
      const tr = document.createElement('tr');
      tr.dataset.kernel = r.label;
      const a = document.createElement('a');
      a.href = '#source';
      a.textContent = r.label;
      a.onclick = () => showSource(r.file, r.entry);
      for (const v of [a, r.file, String(r.calls), r.ms.toFixed(3), `${(100 * r.ms / total).toFixed(1)}%`]) {
        const td = tr.insertCell();
        td.append(v);
      }
      return tr;
    }));
    $('status').textContent = `${preset}, batch ${B} x ${T}: ${total.toFixed(1)} ms of GPU time ` +
      `in ${ops.filter((o) => o.kind === 'dispatch').length} dispatches`;
    if (rows[0]) await showSource(rows[0].file, rows[0].entry);
    document.body.dataset.profiled = '1';
  } catch (e) {
    $('status').textContent = `Profiling failed: ${e.message}`;
    $('status').className = 'status bad';
  } finally {
    $('run').disabled = false;
  }
}

/** The optimizer phase of `variant`: each of its kernels (Optimizer.ops(): the grad norm's
 *  reduction and finalizers, the update, ...) timed as the model's are, a row per kernel. */
async function profileOptimizer(model, variant) {
  const maps = variant.startsWith('adamw_8bit') ? await fetchJson(routePath('optimizer_maps')) : null;
  const opt = await Optimizer.create(state.ctx, model.layout, { variant, W: model.W, G: model.G, maps,
    hyper: FACTS.optimizer_defaults });
  try {
    opt.setStep(1, 1e-3);
    const ops = opt.ops().map((op) => ({ ...op, label: `${op.label} (${variant})` }));
    await profileOps(state.ctx.device, ops);               // warm-up
    return summarize(await profileOps(state.ctx.device, ops));
  } finally {
    opt.destroy();
  }
}


async function main() {
  const presets = await fetchJson(routePath('list_presets'));
  $('preset').replaceChildren(...presets.map((p) => new Option(p.name, p.name)));
  try {
    state.ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE) });
  } catch (e) {
    $('status').textContent = `WebGPU is unavailable: ${e.message} (see Diagnostics)`;
    return;
  }
  if (!state.ctx.features.includes('timestamp-query')) {
    $('status').textContent = 'This adapter has no timestamp-query: GPU times cannot be measured.';
    return;
  }
  $('profile-form').addEventListener('submit', profile);
  await profile();
}

main();
