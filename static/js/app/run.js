// Run page. The tab that created the run (its token is in sessionStorage) trains it on this GPU
// and streams records to the server; any other tab watches the committed records live.
import { SHADER_BASE } from './assets.js';
import { createContext } from '../engine/context.js';
import { makeDecoder } from '../engine/decode.js';
import { fetchLoader } from '../engine/shaders.js';
import { Trainer } from '../engine/trainer.js';
import { Chart } from './charts.js';
import { Derived, RunSeries, clipEvents, phaseMarks, runningSmooth } from './series.js';
import { TrainerSocket, watch } from './telemetry.js';

const $ = (id) => document.getElementById(id);
const runId = $('run').dataset.runId;
const body = document.body;

// Columnar metrics by step (series.js): records may arrive twice (backlog + live) or out of
// order; derived columns extend over new rows only; the charts redraw once per animation frame.
const series = new RunSeries(['loss', 'eval_loss', 'grad_norm', 'clip_scale', 'lr', 'tokens_per_s']);
const clips = clipEvents();
const phases = phaseMarks();
const maxNormLine = new Derived(() => [], (line) => line.push(config?.clip ? config.max_norm : null));
let smoothLoss = null;
let smoothSpeed = null;
let alpha = null;
let config = null;
let charts = null;
let frame = null;
const resumes = [];   // steps the run was resumed from (chart marks)

function setStatus(text, cls = '') {
  $('status').textContent = text;
  $('status').className = `status ${cls}`;
}

function showError(text) {
  $('error').textContent = text;
  $('error').hidden = false;
}

function addRecords(records) {
  for (const r of records) series.add(r);
  $('charts').dataset.steps = String(series.length);
  showLast();
  if (charts && !frame) frame = requestAnimationFrame(draw);
}

/** The latest record's numbers (O(1) per record; the clip count is kept by clipEvents). */
function showLast() {
  const last = series.last;
  if (!last) return;
  stat('step', `${last.step} / ${config?.steps ?? '?'}`);
  stat('loss', last.loss === null ? 'non-finite' : last.loss.toFixed(4));
  stat('grad norm', last.grad_norm?.toFixed(3) ?? '-');
  stat('clip scale', last.clip_scale?.toFixed(3) ?? '-');
  stat('step time', last.step_ms ? `${last.step_ms.toFixed(1)} ms` : '-');
  if (last.opt_ms !== undefined) stat('optimizer (GPU)', `${last.opt_ms.toFixed(2)} ms`);
  // Data seen: B * T tokens a step; passes over the training text (/api/corpus train tokens).
  if (config && trainTokens) {
    const seen = last.step * config.batch_size * config.seq_len;
    const total = trainTokens.reduce((a, s) => a + s.n, 0);
    const least = trainTokens.reduce((a, s) => (s.n < a.n ? s : a));   // if rows spread evenly
    stat('data', `${(seen / 1e6).toFixed(2)} M tokens seen; passes: ${(seen / total).toFixed(2)} ` +
      `over the corpus, ${(seen / trainTokens.length / least.n).toFixed(1)} over ${least.name}`);
  }
}
let trainTokens = null;   // the run's corpus: [{name, n: training tokens}] (GET /api/corpus)

/** One frame: bring the derived columns up to date, then one setData per chart. */
function draw() {
  frame = null;
  const from = series.takeChanged();
  const a = Number($('smoothing').value);
  if (a !== alpha) {
    alpha = a;
    smoothLoss = runningSmooth('loss', alpha);
    smoothSpeed = runningSmooth('tokens_per_s', alpha);
  }
  const xs = series.steps;
  const c = series.cols;
  const clipped = clips.update(series, from);
  phases.update(series, from);
  charts.loss.setData([xs, c.loss, smoothLoss.update(series, from).out, c.eval_loss]);
  charts.norm.setData([xs, c.grad_norm, maxNormLine.update(series, from), clipped.norm]);
  charts.clip.setData([xs, c.clip_scale]);
  charts.lr.setData([xs, c.lr]);
  charts.speed.setData([xs, smoothSpeed.update(series, from).out]);
  stat('clipped steps', String(clipped.count));
}

/** Redraw everything on the next frame (smoothing or scale changed). */
function redraw() {
  series.changedFrom = 0;
  if (charts && !frame) frame = requestAnimationFrame(draw);
}

/** The run was resumed from its checkpoint at `step`: marked on the charts; a live notice (not
 *  the replayed event) also drops the records after it, which are computed again. */
function resumedAt(step, live) {
  if (!resumes.includes(step)) resumes.push(step);
  if (live) series.truncateAfter(step);
  addRecords([]);
}

function stat(name, value) {
  let el = $('stats').querySelector(`[data-stat="${name}"]`);
  if (!el) {
    el = document.createElement('span');
    el.dataset.stat = name;
    $('stats').append(el);
  }
  el.innerHTML = '';
  el.append(`${name}: `);
  const b = document.createElement('b');
  b.textContent = value;
  el.append(b);
}

function addSample(step, text) {
  const box = $('samples');
  if (box.querySelector('p')) box.replaceChildren();
  const div = document.createElement('div');
  div.dataset.step = String(step);
  div.textContent = `step ${step}: ${text}`;
  box.prepend(div);
}

function makeCharts() {
  const parent = $('charts');
  const marks = () => [...phases.state.marks, ...resumes];
  charts = {
    loss: new Chart(parent, 'loss', [{ label: 'train' }, { label: 'smoothed', color: '#0b3d91' },
      { label: 'eval', color: '#e8710a', points: true }], { marks }),
    norm: new Chart(parent, 'grad norm', [{ label: 'grad norm' },
      { label: 'max_norm', color: '#b3261e', dash: [6, 4] },
      { label: 'clipped', color: '#b3261e', points: true }], { marks }),
    clip: new Chart(parent, 'clip scale', [{ label: 'clip scale', color: '#0a7d38' }], { marks }),
    lr: new Chart(parent, 'learning rate', [{ label: 'lr', color: '#8e44ad' }]),
    speed: new Chart(parent, 'tokens/s', [{ label: 'tokens/s', color: '#00838f' }]),
  };
  $('smoothing').addEventListener('input', redraw);
  $('logscale').addEventListener('change', () => {
    charts.loss.setLog($('logscale').checked);
    redraw();
  });
}

function showRun(run) {
  config = run.config;
  if (run.checkpoint?.last_step) {
    stat('last checkpoint', `step ${run.checkpoint.last_step}`);
    const a = $('checkpoint-model');
    a.href = `/api/runs/${runId}/model.safetensors?step=${run.checkpoint.last_step}`;
    a.textContent = `model.safetensors (step ${run.checkpoint.last_step})`;
    a.hidden = false;
  }
  $('resume-run').hidden = !run.can_resume;
  $('branch').hidden = !(run.status === 'failed' && run.checkpoint?.last_step);
  if (!$('branch').hidden) {
    $('branch-step').textContent = String(run.checkpoint.last_step);
    if (!$('branch-lr').value) $('branch-lr').value = String(run.config.lr / 2);
    $('branch-run').onclick = () => branchHere(run);
  }
  if (run.config.parent) {
    const a = $('parent');
    a.href = `/runs/${run.config.parent.run}`;
    a.textContent = `branched from ${run.config.parent.run} at step ${run.config.parent.step}`;
    a.hidden = false;
  }
  const why = run.message && ['interrupted', 'stopped', 'failed'].includes(run.status)
    ? `: ${run.message}` : '';
  $('why').textContent = why;
  stat('preset', config.preset);
  if (!trainTokens) fetch(`/api/corpus?preset=${config.preset}`).then((r) => (r.ok ? r.json() : null)).then((c) => {
    if (c) trainTokens = c.sources.map((s) => ({ name: s.name, n: s.train_tokens }));
  }).catch(() => {});
  stat('optimizer', config.optimizer + (config.f16_mirror ? ' + f16 mirror' : ''));
  stat('optimizer state', `${(run.state_bytes / 2 ** 20).toFixed(2)} MiB`);
  stat('clipping', config.clip ? `max_norm ${config.max_norm}` : 'off');
  if (run.adapter) stat('adapter', `${run.adapter.vendor} ${run.adapter.architecture}`.trim());
  body.dataset.status = run.status;
}

async function train(run, token) {
  $('mode').textContent = '(training in this tab)';
  const socket = new TrainerSocket(runId, token, {
    onState: (s, why) => { body.dataset.socket = s; if (s === 'refused') showError(`Server refused: ${why}`); },
  });
  const ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE),
    onError: (m) => showError(`GPU error: ${m}`), onLost: (m) => showError(m) });
  const { info, software } = ctx;
  const adapter = { vendor: info.vendor, architecture: info.architecture,
    description: info.description, software };
  stat('adapter', `${info.vendor} ${info.architecture}${software ? ' (software)' : ''}`);
  const [layout, maps, tok] = await Promise.all([
    fetch(`/api/presets/${config.preset}/layout`).then((r) => r.json()),
    fetch('/api/optimizer/maps').then((r) => r.json()),
    fetch(`/api/tokenizer/${config.preset}`).then((r) => r.json()),
  ]);
  const fetchBody = (url) => fetchRetrying(url).then((r) => r.arrayBuffer());
  // A resumed (or branched) run continues from its last checkpoint: the state after step K.
  const from = run.checkpoint?.last_step ?? null;
  let resume = null;
  if (from !== null) {
    setStatus(`Loading the checkpoint of step ${from}…`);
    const res = await fetchRetrying(`/api/runs/${runId}/checkpoints/${from}`,
      { headers: { authorization: `Bearer ${token}` } });
    resume = { step: from, data: await res.arrayBuffer() };
  }
  setStatus(from === null ? 'Compiling kernels and initialising weights…'
    : `Compiling kernels; resuming from step ${from}…`);
  const uploader = new CheckpointUploader(token);
  const trainer = await Trainer.create({
    ctx, layout, config, maps, decode: makeDecoder(tok), checkpoint: run.checkpoint, resume,
    loadBatch: (step) => fetchBody(`/api/runs/${runId}/batches/${step}`),
    loadValBatch: (i) => fetchBody(`/api/runs/${runId}/val_batches/${i}`),
    on: {
      checkpoint: (ckpt) => uploader.upload(ckpt),
      record: (r) => { socket.push(r); addRecords([r]); },
      sample: (step, text) => { socket.send({ type: 'sample', step, text }); addSample(step, text); },
      status: (status, message) => {
        body.dataset.status = status;
        socket.send({ type: 'status', status, ...(message ? { message } : {}),
          ...(status === 'running' ? { adapter } : {}) });
        setStatus(`${status}${message ? `: ${message}` : ''}`, status === 'failed' ? 'bad' : 'ok');
      },
    },
  });
  window.andreaTrainer = trainer;   // tests and the headless CLI read trainer.stats
  $('trainer-controls').hidden = false;
  $('pause').onclick = () => { trainer.pause(); $('pause').hidden = true; $('resume').hidden = false; };
  $('resume').onclick = () => { trainer.resume(); $('pause').hidden = false; $('resume').hidden = true; };
  $('stop').onclick = () => trainer.stop();
  // The weights and optimizer state live only on this tab's GPU: leaving would end the run.
  const stay = (e) => { e.preventDefault(); e.returnValue = ''; };
  window.addEventListener('beforeunload', stay);
  let final;
  try {
    final = await trainer.run();
  } catch (e) {
    showError(`Training failed: ${e.message}`);
    final = 'failed';
  }
  $('trainer-controls').hidden = true;   // nothing left to pause or stop
  if (final === 'finished' || final === 'stopped') await saveWeights(trainer, token);
  trainer.destroy();   // weights saved (or the run failed): free the GPU memory
  const lastStep = series.last?.step ?? 0;
  await socket.committed(lastStep);
  await socket.sync();
  window.removeEventListener('beforeunload', stay);   // weights saved, every record committed
  body.dataset.committed = String(lastStep);
  stat('ring waits', `${trainer.stats.ringWaits} (GPU starved ${trainer.stats.gpuStarved})`);
  socket.close();
  sessionStorage.removeItem(`andrea.run.${runId}`);  // a reload must not train it again
  body.dataset.done = final;
}

/** fetch() that rides out a server restart: network errors and 5xx are retried with backoff
 *  (about a minute in all); 4xx is final and reported. */
async function fetchRetrying(url, init = {}, attempts = 12) {
  let wait = 250;
  for (let i = 1; ; i++) {
    let res = null;
    try {
      res = await fetch(url, init);
    } catch (e) {
      if (i >= attempts) throw new Error(`${url}: ${e.message}`);
    }
    if (res?.ok) return res;
    if (res && res.status < 500) throw new Error(`${url}: ${res.status} ${await res.text()}`);
    if (i >= attempts) throw new Error(`${url}: ${res ? res.status : 'unreachable'}`);
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, 8000);
  }
}

/** Uploads the trainer's checkpoints (the complete training state) to the server, one at a time.
 *  A failed upload (a full disk, a restarting server) is shown and retried with the next
 *  checkpoint; training goes on meanwhile. */
class CheckpointUploader {
  constructor(token) {
    this.token = token;
  }

  async upload(ckpt) {
    const t0 = performance.now();
    try {
      const res = await fetch(`/api/runs/${runId}/checkpoints/${ckpt.step}`, {
        method: 'PUT', body: new Blob(ckpt.parts),
        headers: { authorization: `Bearer ${this.token}`, 'content-type': 'application/octet-stream',
          'x-andrea-chunk-sha256': ckpt.chunkSha256.join(',') } });
      if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
      const ms = performance.now() - t0;
      stat('checkpoint', `step ${ckpt.step} (${(ckpt.bytes / 2 ** 20).toFixed(1)} MiB, ` +
        `read ${ckpt.readMs.toFixed(0)} ms, upload ${ms.toFixed(0)} ms)`);
      body.dataset.checkpoint = String(ckpt.step);
      $('checkpoint-error').hidden = true;
    } catch (e) {
      $('checkpoint-error').textContent = `Checkpoint of step ${ckpt.step} not saved ` +
        `(${e.message}); training goes on and the next checkpoint tries again.`;
      $('checkpoint-error').hidden = false;
      throw e;   // the trainer counts it as not saved (a stop checkpoint is then tried again)
    }
  }
}

/** Takes the run over in this tab from its last checkpoint (a new write token; the tab that
 *  trained it before, if it comes back, is refused). */
async function resumeHere() {
  $('resume-run').disabled = true;
  const res = await fetch(`/api/runs/${runId}/resume`, { method: 'POST' });
  if (!res.ok) {
    const detail = (await res.json().catch(() => ({}))).detail ?? res.status;
    showError(`Cannot resume: ${detail}`);
    $('resume-run').disabled = false;
    return;
  }
  const { token } = await res.json();
  sessionStorage.setItem(`andrea.run.${runId}`, JSON.stringify({ token }));
  location.reload();
}

/** A failed run continues as a NEW run from its last checkpoint, with another learning rate;
 *  the new run records its parent (run and step). */
async function branchHere(run) {
  const lr = Number($('branch-lr').value);
  const schema = await (await fetch('/api/run_config')).json();   // RunConfig's own fields
  const cfg = Object.fromEntries(Object.entries(run.config)
    .filter(([k]) => k in schema.properties && k !== 'parent'));
  const res = await fetch('/api/runs', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...cfg, lr, parent: { run: runId, step: run.checkpoint.last_step } }) });
  const out = await res.json().catch(() => ({}));
  if (!res.ok) {
    showError(`Cannot branch: ${JSON.stringify(out.detail ?? res.status)}`);
    return;
  }
  sessionStorage.setItem(`andrea.run.${out.id}`, JSON.stringify({ token: out.token }));
  location.href = `/runs/${out.id}`;
}

/** Upload the trained weights (W, table order) so the run can be exported to PyTorch. */
async function saveWeights(trainer, token) {
  try {
    const w = await trainer.model.getParams();
    const res = await fetch(`/api/runs/${runId}/weights`, { method: 'PUT', body: w,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' } });
    if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
    showModelLink();
    body.dataset.weights = 'saved';
  } catch (e) {
    showError(`Could not save the trained weights: ${e.message}`);
  }
}

function showModelLink() {
  const a = $('model');
  a.hidden = false;
}

function view() {
  $('mode').textContent = '(watching)';
  watch(runId, (msg) => {
    if (msg.type === 'records') addRecords(msg.records);
    else if (msg.type === 'run') { showRun(msg.run); setStatus(msg.run.status); }
    else if (msg.type === 'sample') addSample(msg.step, msg.text);
    else if (msg.type === 'resumed') resumedAt(msg.step, msg.kind === undefined);
  }, (s) => { body.dataset.socket = s; });
}

async function main() {
  const res = await fetch(`/api/runs/${runId}`);
  if (!res.ok) {
    setStatus(`No run ${runId} here.`, 'bad');
    body.dataset.status = 'missing';
    return;
  }
  const run = await res.json();
  showRun(run);
  if (run.has_weights) showModelLink();
  makeCharts();
  $('resume-run').onclick = resumeHere;
  const saved = JSON.parse(sessionStorage.getItem(`andrea.run.${runId}`) || 'null');
  if (saved && run.status === 'created') {
    if (run.checkpoint?.last_step) {   // a resumed run: the steps before its checkpoint
      addRecords(await (await fetch(`/api/runs/${runId}/metrics`)).json());
      resumedAt(run.checkpoint.last_step, false);
    }
    try {
      await train(run, saved.token);
    } catch (e) {
      showError(`Cannot train here: ${e.message}`);
      body.dataset.done = 'failed';
      throw e;
    }
  } else {
    setStatus(run.status);
    view();
  }
}

main();
