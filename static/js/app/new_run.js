// New-run page: pick preset, optimizer and hyperparameters; see the memory the choice needs on
// this GPU; start. The run's write token stays in this tab's sessionStorage, never in a URL.
import { createContext } from '../engine/context.js';
import { activationBytes, limitProblems } from '../engine/model.js';
import { fetchLoader } from '../engine/shaders.js';
import { HttpError, jsonBody, responseDetail, saveToken } from './api.js';
import { SHADER_BASE } from './assets.js';
import { bindClipExperiment } from './clip_experiment.js';
import { fmtBytesPerParam, fmtCount } from './format.js';
import { precisionNote } from './mixed_note.js';
import { isolated, shownText } from './text.js';
import { routePath } from './facts.js';

const $ = (id) => document.getElementById(id);
const form = $('new-run');
// Sizes in the unit that reads best ("512.0 MiB", "90.5 GiB").
const MiB = (b) => (b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(1)} GiB` : `${(b / 2 ** 20).toFixed(1)} MiB`);
// server/data/windows.py PASSES_WARNING, as the page is rendered with it.
const PASSES_WARNING = Number($('data-budget').dataset.passesWarning);
const state = {
  limits: null,             // this adapter's (acquireDevice); null: no WebGPU here
  software: false,          // the adapter is a CPU (SwiftShader, llvmpipe): gpu.js isSoftware
  layouts: new Map(),       // shape -> Promise of the server's layout
  corpora: new Map(),       // vocabulary size -> Promise of GET /api/corpus
};

/** The form's words for the API's names ({lr: 'Learning rate'}): its inputs' labels, the
 *  source checkboxes', and head_dim, which the model's shape rules name but no input sets. */
function fieldLabels() {
  const out = { sources: 'Sources', head_dim: 'Width / Heads' };
  for (const el of form.elements) if (el.name && el.dataset.label) out[el.name] = el.dataset.label;
  return out;
}

/** The server's JSON; a refusal throws its reasons in the form's words (its labels, not the
 *  API's names: api.js detailText). The API's own answer stays as it is for its clients. */
async function json(url, init) {
  const res = await fetch(url, init);
  if (!res.ok) throw new HttpError(res.status, await responseDetail(res, null, fieldLabels()));
  return res.json();
}

/** The run config the form describes. Inputs, defaults and bounds are RunConfig's (the page
 *  is rendered from its schema); an empty optional number is left out: the server decides. */
function config() {
  const out = {};
  const room = {};
  for (const el of form.elements) {
    if (!el.name || (el.type === 'radio' && !el.checked)) continue;
    if (el.name.startsWith('room.')) {   // a room run's field (templates/index.html)
      if (el.type === 'checkbox') room[el.name.slice(5)] = el.checked;
      else if (el.value !== '') room[el.name.slice(5)] = el.type === 'number' ? Number(el.value) : el.value;
      continue;
    }
    if (el.type === 'checkbox') out[el.name] = el.checked;
    else if (el.value !== '') {
      out[el.name] = el.type === 'number' || 'number' in el.dataset ? Number(el.value) : el.value;
    }
  }
  // The corpus sources to train on: left out while every one is checked (the server's
  // default, all of them), else the checked ones' names.
  const boxes = sourceBoxes();
  if (boxes.some((b) => !b.checked)) out.sources = boxes.filter((b) => b.checked).map((b) => b.value);
  // A toy task's batches are its problems: the corpus's fields are not its (and digits are
  // only a task's).
  if (out.task) {
    delete out.sources;
    delete out.data_mode;
  } else {
    delete out.task_digits;
  }
  if ($('room-run').checked) out.room = room;
  return out;
}

/** The source checkboxes (no name: config() reads them as one list). */
function sourceBoxes() {
  return [...form.querySelectorAll('input[data-source]')];
}

/** One checkbox per corpus source, all checked; made once (the corpus of every vocabulary
 *  size has the same sources, in the same order). */
function showSources(corpus) {
  if (sourceBoxes().length) return;
  const label = document.createElement('span');
  label.textContent = 'Sources';
  $('sources').replaceChildren(label, ...corpus.sources.map((s) => {
    const l = document.createElement('label');
    l.className = 'inline';
    const input = Object.assign(document.createElement('input'),
      { type: 'checkbox', value: s.name, checked: true });
    input.dataset.source = s.name;
    const small = document.createElement('small');
    small.textContent = `(${s.kind}, ${fmtCount(s.train_tokens)} training tokens)`;
    l.append(input, ' ', isolated(s.name), ' ', small);
    return l;
  }));
}

/** A bound the value may not take (lr > 0: data-min-exclusive, from RunConfig's schema),
 *  which HTML's inclusive min and max cannot say: set as the input's own validity. */
function checkExclusive(el) {
  const v = el.value === '' ? NaN : Number(el.value);    // empty or no number: HTML's to say
  let why = '';
  if ('minExclusive' in el.dataset && v <= Number(el.min)) why = `must be greater than ${el.min}`;
  if ('maxExclusive' in el.dataset && v >= Number(el.max)) why = `must be less than ${el.max}`;
  el.setCustomValidity(why);
}

/** What the form's own limits refuse, in words ("Learning rate is required"). */
function problems() {
  for (const el of form.querySelectorAll('[data-min-exclusive], [data-max-exclusive]')) checkExclusive(el);
  const out = [...form.elements].filter((el) => el.name && !el.checkValidity()).map((el) => {
    const label = el.dataset.label ?? el.name;
    return el.validity.valueMissing ? `${label} is required` : `${label}: ${el.validationMessage}`;
  });
  const boxes = sourceBoxes();
  if (boxes.length && !boxes.some((b) => b.checked)) out.push('Sources: pick at least one');
  return out;
}

// The fields that make the model (the preset, and the shape fields that override it).
const SHAPE = form.dataset.shapeFields.split(' ');   // as the page is rendered (server/model.py)

/** The parameter table of the model the form describes, computed by the server (the one place
 *  it is computed); a shape it refuses rejects with the reason. */
async function layoutOf(c) {
  // (A toy task decides the vocabulary: its alphabet's.)
  const shape = Object.fromEntries([...SHAPE, 'task'].filter((k) => k in c).map((k) => [k, c[k]]));
  const key = JSON.stringify(shape);
  if (!state.layouts.has(key)) {
    state.layouts.set(key, json(routePath('run_config_layout'), jsonBody('POST', shape)));
  }
  return state.layouts.get(key);
}

async function corpusOf(vocabSize) {
  if (!state.corpora.has(vocabSize)) state.corpora.set(vocabSize, json(`${routePath('corpus')}?vocab_size=${vocabSize}`));
  return state.corpora.get(vocabSize);
}

/** The shape inputs show the chosen preset's values as their placeholders. */
function showPresetShape(presets) {
  const preset = presets.find((p) => p.name === $('preset').value);
  if (!preset) return;
  for (const k of SHAPE.filter((f) => f !== 'preset')) {
    const el = form.elements.namedItem(k);
    if (el?.type === 'number') el.placeholder = String(preset.config[k]);
  }
  $('vocab_size').options[0].textContent = `the preset's (${preset.config.vocab_size})`;
}

/** What a run reads (server/data/windows.py data_budget, on /api/corpus's train tokens): B * T
 *  tokens a step, and the expected passes over each source's training part when rows are spread
 *  evenly over the picked sources (the bandit keeps each at 20% / K or more of the rows). */
function dataBudget(trainTokens, B, T, steps, picked = trainTokens.map(() => true)) {
  const w = trainTokens.map((n, i) => (picked[i] && n >= T + 1 ? 1 : 0));
  const sum = w.reduce((a, x) => a + x, 0) || 1;
  const total = B * T * steps;
  const passes = trainTokens.map((n, i) => (n > 0 ? (total * w[i]) / sum / n : 0));
  return { tokensPerStep: B * T, total, passes, warn: passes.some((p) => p > PASSES_WARNING) };
}

// Each form change starts an update, and their server answers can arrive in any order (a loaded
// server answered an in-between shape's layout after the final one's): only the newest draws.
const turns = { data: 0, memory: 0 };

/** How much data the run sees: tokens per step, in all, and passes over each source. */
async function updateData() {
  const turn = ++turns.data;
  const c = config();
  for (const el of form.querySelectorAll('.corpus-field')) el.hidden = Boolean(c.task);
  $('task-fields').hidden = !c.task;
  if (c.task) return showTask(c, turn);
  const layout = await layoutOf(c);
  const corpus = await corpusOf(layout.config.vocab_size);
  if (turn !== turns.data) return;
  const T = c.seq_len ?? layout.config.seq_len;
  const B = c.batch_size ?? 0;
  const steps = c.steps ?? 0;
  showSources(corpus);
  const picked = corpus.sources.map((s) => !c.sources || c.sources.includes(s.name));
  const b = dataBudget(corpus.sources.map((s) => s.train_tokens), B, T, steps, picked);
  const box = $('data-budget');
  box.innerHTML = '';
  const table = document.createElement('table');
  const row = (k, v) => { const tr = table.insertRow(); tr.insertCell().textContent = k; tr.insertCell().textContent = v; };
  row('tokens per step', `${fmtCount(b.tokensPerStep)} (batch ${B} x ${T})`);
  row('tokens in the run', fmtCount(b.total));
  corpus.sources.forEach((s, i) => row(`passes over ${shownText(s.name)}`, picked[i]
    ? `${b.passes[i].toFixed(2)} (${fmtCount(s.train_tokens)} training tokens)` : 'not used'));
  box.append(table);
  box.dataset.passes = JSON.stringify(b.passes.map((p) => Number(p.toFixed(3))));
  const mode = c.data_mode === 'uniform' ? '' : ' (counted as if spread evenly over the sources)';
  const note = document.createElement('small');
  note.textContent = `Held-out documents of every source are never trained on${mode}.`;
  box.append(note);
  if (b.warn) {
    const over = corpus.sources.filter((_, i) => b.passes[i] > PASSES_WARNING).map((s) => shownText(s.name));
    const p = document.createElement('p');
    p.className = 'error';
    p.textContent = `This run reads ${over.join(', ')} more than ${PASSES_WARNING} times: past a few ` +
      'passes the model memorises that text, and its eval loss may stop falling or rise. ' +
      'Fewer steps, a smaller batch, or more text (andrea serve --corpus) avoid it.';
    box.append(p);
  }
}

/** A toy task's problems: an example, how many a row holds, and what the accuracy counts. */
async function showTask(c, turn) {
  const digits = c.task_digits ? `?digits=${c.task_digits}` : '';
  const [task, layout] = await Promise.all([
    json(`${routePath('task_info', { task: c.task })}${digits}`), layoutOf(c)]);
  if (turn !== turns.data) return;
  const T = c.seq_len ?? layout.config.seq_len;
  $('task-example').textContent = `a problem: ${task.example.trim()}`;
  const box = $('data-budget');
  box.textContent = `Each row holds ${Math.floor((T + 1) / task.problem_len)} whole problems of ` +
    `${task.problem_len} characters (context ${T}), made from the run's seed; each eval counts ` +
    'the held-out problems whose whole answer the model predicts (exact match). Problems ' +
    'held out are never trained on.';
  // On a CPU adapter the task's size is the difference between a minute and ten
  // (bench/results/tasks_swiftshader.txt).
  if (state.software) {
    box.textContent += ' This browser trains on the CPU (no GPU adapter): tiny reverses 4 ' +
      'digits in about a minute; 10 digits on toy take about ten.';
  }
  box.dataset.passes = '[]';
}

/** Memory the choice needs, and whether this adapter can hold it. */
async function updateMemory() {
  const turn = ++turns.memory;
  const c = config();
  let layout;
  try {
    layout = await layoutOf(c);
  } catch (e) {   // a shape the server refuses: say why, and nothing to start
    if (turn !== turns.memory) return;
    $('memory').textContent = '';
    const p = Object.assign(document.createElement('p'), { className: 'error',
      textContent: `This model cannot be built: ${e.message.replace(/^model shape: /, '')}` });
    $('memory').append(p);
    $('start').disabled = true;
    $('clip-experiment').disabled = true;
    return;
  }
  if (turn !== turns.memory) return;
  const T = c.seq_len ?? layout.config.seq_len;
  const variant = c.optimizer;
  const opt = layout.optimizer_state[variant];
  const weights = layout.total_numel * 4;
  const mirror = c.f16_mirror ? layout.total_numel * 2 : 0;
  const B = c.batch_size ?? 0;
  const acts = activationBytes(layout.config, B, T, state.limits, c.precision === 'mixed').total;
  // Where evals run, each also measures the model's inside: the update probe keeps a copy of
  // the weights (engine/update_probe.js).
  const probe = c.eval_every > 0 ? weights : 0;
  // An int8 room's worker keeps the version it holds beside the weights, and three int8 bodies
  // (engine/room_gpu.js: its pseudo-gradient, that read back, the next version's update): ~7
  // bytes a parameter; overlapped, the round's end as well (4 more).
  const body = Math.ceil(layout.total_numel / 4) * 4 + 4 * Math.ceil(layout.total_numel / 256);
  const roomDelta = c.room?.codec === 'int8' ? weights + 3 * body
    + (c.room.overlap ? weights : 0) : 0;
  const total = 2 * weights + opt.state_bytes + mirror + acts + probe + roomDelta;
  const rows = [
    ['parameters', `${(layout.n_params / 1e6).toFixed(2)} M`],
    ['weights + grads (f32)', MiB(2 * weights)],
    [`optimizer state (${variant === 'adamw' ? 'fp32 m, v'
      : `8-bit m, v; f32 for ${opt.f32_tensors.filter((n) => !n.endsWith('norm.weight')).join(', ') || 'norm gains only'}`})`,
      `${MiB(opt.state_bytes)} (${fmtBytesPerParam(opt.bytes_per_param)})`],
    ...(mirror ? [['f16 weight mirror', MiB(mirror)]] : []),
    [`activations (batch ${B} x ${T})`, MiB(acts)],
    ...(probe ? [['weights before an eval step (the inside\'s update ratio)', MiB(probe)]] : []),
    ...(roomDelta ? [[`room worker: the version held, ${c.room.overlap ? 'the round\'s end, ' : ''}its int8 pseudo-gradient and update`,
      MiB(roomDelta)]] : []),
    ['estimated GPU memory', MiB(total)],
  ];
  const gpuProblems = state.limits ? limitProblems(layout, B, T, state.limits) : [];
  $('memory').innerHTML = '';
  const table = document.createElement('table');
  for (const [k, v] of rows) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
  $('memory').append(table);
  $('memory').dataset.stateBytes = String(opt.state_bytes);
  if (!state.limits) {
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
  $('start').disabled = !state.limits || gpuProblems.length > 0;
  $('clip-experiment').disabled = $('start').disabled;
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
    const run = await json(routePath('create_run'), jsonBody('POST', config()));
    saveToken(run.id, run.token);
    // A room run's page takes its join token from the fragment (never sent to a server).
    location.href = routePath('run_page', { run_id: run.id }) +
      (run.room ? `#join=${encodeURIComponent(run.room.join_token)}` : '');
  } catch (e) {
    $('form-error').textContent = `Cannot start: ${e.message}`;
    $('form-error').hidden = false;
    $('start').disabled = false;
  }
}

/** Mixed precision is offered where this browser's adapter has f16 subgroup matrices; the
 *  note (mixed_note.js precisionNote) says why not elsewhere, and how Chrome offers them where a
 *  flag would; where it is offered, it speaks of mixed precision only while that is chosen.
 *  `ctx`: the engine's context on this adapter (null: no WebGPU here). */
function showPrecision(support, ctx) {
  const option = [...$('precision').options].find((o) => o.value === 'mixed');
  if (!option) return;
  option.disabled = !support.ok;
  $('precision').dataset.mixed = support.ok ? 'available' : 'unavailable';
  const note = () => {
    const text = precisionNote(support, ctx, $('precision').value);
    $('precision-note').textContent = text;
    $('precision-note').hidden = !text;
  };
  note();
  $('precision').addEventListener('change', note);
}

async function main() {
  const presets = await json(routePath('list_presets'));
  $('preset').replaceChildren(...presets.map((p) => new Option(
    `${p.name} (${(p.n_params / 1e6).toFixed(1)} M parameters, context ${p.config.seq_len} tokens)`, p.name)));
  // The adapter's limits and what it says of mixed precision, as a training tab's context would
  // have them (the features requested where it has them; context.js asks mixedSupport).
  let ctx = null;
  try {
    ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE), mixed: 'optional' });
    ctx.destroy();
    state.limits = ctx.limits;
    state.software = ctx.software;
  } catch {
    state.limits = null;
  }
  showPrecision(ctx?.mixed ?? { ok: false, why: 'no WebGPU here' }, ctx);
  showPresetShape(presets);
  $('preset').addEventListener('change', () => showPresetShape(presets));
  $('room-run').addEventListener('change', () => { $('room-fields').hidden = !$('room-run').checked; });
  // A toy task picked on tiny: the preset sized for the tasks instead (server/model.py toy).
  $('task').addEventListener('change', () => {
    if ($('task').value && $('preset').value === 'tiny' && presets.some((p) => p.name === 'toy')) {
      $('preset').value = 'toy';
      showPresetShape(presets);
    }
  });
  form.addEventListener('input', () => updateMemory().catch(console.error));
  form.addEventListener('input', () => updateData().catch((e) => {
    $('data-budget').textContent = `Corpus unavailable: ${e.message}`;
  }));
  form.addEventListener('submit', start);
  bindClipExperiment($('clip-experiment'), { config, problems, json, fail: (text) => {
    $('form-error').textContent = text;
    $('form-error').hidden = false;
  } });
  await Promise.all([updateMemory(), updateData().catch((e) => {
    $('data-budget').textContent = `Corpus unavailable: ${e.message}`;
  })]);
  document.body.dataset.ready = '1';
}

main();
