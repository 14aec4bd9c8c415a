// Run page. The tab that created the run (its token is in sessionStorage) trains it on this GPU
// and streams records to the server; any other tab watches the committed records live.
import { SHADER_BASE } from './assets.js';
import { createContext } from '../engine/context.js';
import { fetchLoader } from '../engine/shaders.js';
import { Trainer } from '../engine/trainer.js';
import { COLORS, Chart, DASHES, fmtBytes, fmtCount, fmtDuration, fmtValue } from './charts.js';
import {
  Derived, RunSeries, clipEvents, elapsedColumn, phaseMarks, progress, runningSmooth, sourceColumns,
} from './series.js';
import { isTraining, statusLabel, statusNote } from './run_status.js';
import { TrainerSocket, watch } from './telemetry.js';
import { utf8Decoder } from './text.js';

const $ = (id) => document.getElementById(id);
const runId = $('run').dataset.runId;
const body = document.body;

// Columnar metrics by step (series.js): records may arrive twice (backlog + live) or out of
// order; derived columns extend over new rows only; the charts redraw once per animation frame.
const series = new RunSeries(['loss', 'eval_loss', 'grad_norm', 'clip_scale', 'lr', 'tokens_per_s',
  'step_ms', 'opt_ms']);
const clips = clipEvents();
const phases = phaseMarks();
const sources = sourceColumns();
const elapsed = elapsedColumn();
const maxNormLine = new Derived(() => [], (line) => line.push(config?.clip ? config.max_norm : null));
// Best eval loss so far (O(1) per row).
const bestEval = new Derived(() => ({ best: null, last: null }), (s, ser, i) => {
  const v = ser.cols.eval_loss[i];
  if (v === null || !Number.isFinite(v)) return;
  s.last = v;
  if (s.best === null || v < s.best) s.best = v;
});
let smoothLoss = null;
let smoothSpeed = null;
let smoothSources = null;
let alpha = null;
let config = null;
let charts = null;
let sourceCharts = null;
let frame = null;
let dataInfo = null;       // GET /api/runs/{id}/data: sources and the bandit's phases so far
let runStatus = null;
// Watching (not training here): whether a training tab holds the run now. The server says so
// with each run message (`connected`); a record committed after that message's last step can
// only come from a trainer, so it says so too (a tab back after a dropped connection).
let watching = false;
let trainerSocket = null;   // this tab's, while it trains the run
let viewedRun = null;
let trainerHere = null;
let stepAtRun = 0;
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
  if (watching && !trainerHere && viewedRun && records.some((r) => r.step > stepAtRun)) {
    trainerHere = true;
    showViewedStatus();
  }
  // The server stamps each committed row with its time; this tab's own records get its clock.
  for (const r of records) series.add(r.time === undefined ? { ...r, time: Date.now() / 1000 } : r);
  $('charts').dataset.steps = String(series.length);
  showLast();
  if (charts && !frame) frame = requestAnimationFrame(draw);
}

/** The latest record's numbers and the run's progress (O(1) per record; the clip count is
 *  kept by clipEvents, the best eval loss by bestEval). */
function showLast() {
  const last = series.last;
  if (!last) return;
  const total = config?.steps ?? 0;
  const p = progress(series, total);
  const done = ['finished', 'stopped', 'failed', 'interrupted'].includes(runStatus);
  $('progress-box').hidden = false;
  $('progress').value = p.fraction;
  const pct = p.fraction < 0.1 ? Math.floor(p.fraction * 1000) / 10 : Math.floor(p.fraction * 100);
  const parts = [`${pct} %`,
    `step ${last.step} of ${total}`];
  if (p.elapsed !== null) parts.push(`elapsed ${fmtDuration(p.elapsed)}`);
  // No time left without a trainer: a closed tab's run is not getting anywhere.
  const live = !watching || (viewedRun && isTraining(viewedRun, trainerHere));
  if (p.eta !== null && p.perStep > 0 && last.step < total && !done && live) parts.push(`about ${fmtDuration(p.eta)} left`);
  $('progress-text').textContent = parts.join(' · ');
  body.dataset.progress = p.fraction.toFixed(3);
  stat('step', `${last.step} / ${total || '?'}`);
  stat('loss', last.loss === null ? 'not finite' : fmtValue(last.loss), 'training loss');
  const ev = bestEval.update(series, series.changedFrom);
  if (ev.last !== null) stat('eval loss', `${fmtValue(ev.last)} (best ${fmtValue(ev.best)})`);
  if (config) {
    const seen = last.step * config.batch_size * config.seq_len;
    stat('tokens seen', fmtCount(seen));
  }
  if (last.tokens_per_s) stat('tokens/s', fmtCount(last.tokens_per_s), 'speed');
  stat('step time', last.step_ms ? `${last.step_ms.toFixed(1)} ms` : '-');
  stat('grad norm', fmtValue(last.grad_norm), 'gradient norm');
  stat('clip scale', last.clip_scale === null || last.clip_scale === undefined ? '-'
    : last.clip_scale >= 1 ? 'not clipped' : `scaled by ${fmtValue(last.clip_scale, 3)}`,
  'last step');
  stat('lr', fmtValue(last.lr), 'learning rate');
  if (last.opt_ms !== undefined) stat('optimizer (GPU)', `${last.opt_ms.toFixed(2)} ms`, 'optimizer time (GPU)');
  // Data seen: B * T tokens a step; passes over the training text (/api/corpus train tokens).
  if (config && trainTokens) {
    const seen = last.step * config.batch_size * config.seq_len;
    const totalTokens = trainTokens.reduce((a, s) => a + s.n, 0);
    const least = trainTokens.reduce((a, s) => (s.n < a.n ? s : a));   // if rows spread evenly
    stat('data', `${(seen / totalTokens).toFixed(2)} passes over the corpus, ` +
      `${(seen / trainTokens.length / least.n).toFixed(1)} over ${least.name}`, 'data read', true);
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
    smoothSources = [];
    $('smoothing-value').textContent = alpha.toFixed(2);
  }
  const c = series.cols;
  const clipped = clips.update(series, from);
  const t = elapsed.update(series, from).out;
  const xs = $('xaxis').value === 'time' ? t : series.steps;
  phases.update(series, from);
  charts.loss.setData([xs, c.loss, smoothLoss.update(series, from).out, c.eval_loss]);
  charts.norm.setData([xs, c.grad_norm, maxNormLine.update(series, from), clipped.norm]);
  charts.clip.setData([xs, c.clip_scale]);
  charts.lr.setData([xs, c.lr]);
  charts.speed.setData([xs, smoothSpeed.update(series, from).out]);
  charts.time.setData([xs, c.step_ms, c.opt_ms]);
  if (sourceCharts) drawSources(xs, from);
  stat('clipped steps', `${clipped.count} of ${series.length}`);
}

/** The bandit's view: each source's (smoothed) training loss, and its sampling weight per
 *  phase (GET /api/runs/{id}/data) drawn as steps. */
function drawSources(xs, from) {
  const cols = sources.update(series, from).cols;
  const names = dataInfo.sources;
  sourceCharts.loss.setData([xs, ...names.map((_, i) => {
    if (!smoothSources[i]) smoothSources[i] = smoothColumn(() => cols[i] ?? []);
    return smoothSources[i].update(series, from).out;
  })]);
  const wx = [];
  const wy = names.map(() => []);
  const onTime = $('xaxis').value === 'time';
  for (const ph of dataInfo.phases) {
    for (const step of [ph.start + 1, ph.start + ph.length]) {
      wx.push(onTime ? xs[rowOf(step)] ?? null : step);
      ph.weights.forEach((w, i) => wy[i].push(w));
    }
  }
  const keep = wx.map((x) => x !== null);
  sourceCharts.weight.setData([wx.filter((_, i) => keep[i]), ...wy.map((col) => col.filter((_, i) => keep[i]))]);
}

/** Running EMA of a column outside the series (a source's losses), one row at a time. */
function smoothColumn(getCol) {
  return new Derived(() => ({ out: [], m: 0, n: 0 }), (s, _ser, i) => {
    const y = getCol()[i] ?? null;
    if (!alpha) { s.out.push(y); return; }
    if (y === null || !Number.isFinite(y)) { s.out.push(null); return; }
    s.m = alpha * s.m + (1 - alpha) * y;
    s.n += 1;
    s.out.push(s.m / (1 - alpha ** s.n));
  });
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

/** One figure in the stats line (`label`: its words, default the name; `detail`: under the
 *  "Details" toggle instead, for internal counters). */
function stat(name, value, label = name, detail = false) {
  const box = detail === true ? $('details-stats') : detail === 'setup' ? $('setup') : $('stats');
  let el = document.querySelector(`[data-stat="${name}"]`);
  if (!el) {
    el = document.createElement('span');
    el.dataset.stat = name;
    box.append(el);
  }
  el.innerHTML = '';
  el.append(`${label}: `);
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

/** Chart marks: bandit phase changes (from the records, and every phase the server decided)
 *  and resumes. */
function marks() {
  const out = [...phases.state.marks, ...resumes];
  if (dataInfo) for (const ph of dataInfo.phases) if (ph.index > 0) out.push(ph.start + 1);
  if ($('xaxis').value !== 'time') return out;
  const t = elapsed.state.out;   // the marks' steps on the wall-clock axis
  return out.map((step) => t[rowOf(step)]).filter((x) => x !== undefined);
}

/** The row of `step` in the series (-1: none), by binary search. */
function rowOf(step) {
  const xs = series.steps;
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < step) lo = mid + 1; else hi = mid;
  }
  return xs[lo] === step ? lo : -1;
}

function allCharts() {
  return [...Object.values(charts ?? {}), ...Object.values(sourceCharts ?? {})];
}

function makeCharts(placeholder) {
  const parent = $('charts');
  const o = { marks, placeholder };
  charts = {
    loss: new Chart(parent, 'loss', [{ label: 'train' }, { label: 'smoothed', color: '#0b3d91' },
      { label: 'eval', color: '#e8710a', points: true }], { ...o, y: 'loss (nats/token)', positive: true }),
    norm: new Chart(parent, 'gradient norm', [{ label: 'grad norm' },
      { label: 'max_norm', color: '#b3261e', dash: [6, 4] },
      { label: 'clipped', color: '#b3261e', points: true }], { ...o, y: 'global L2 norm', positive: true }),
    clip: new Chart(parent, 'clip scale', [{ label: 'clip scale', color: '#0a7d38' }],
      { ...o, y: 'scale (1: not clipped)' }),
    lr: new Chart(parent, 'learning rate', [{ label: 'lr', color: '#8e44ad' }],
      { ...o, y: 'learning rate', positive: true }),
    speed: new Chart(parent, 'speed', [{ label: 'tokens/s', color: '#00838f' }],
      { ...o, y: 'tokens / s', positive: true }),
    time: new Chart(parent, 'step time', [{ label: 'step', color: '#5d4037' },
      { label: 'optimizer (GPU)', color: '#c2185b' }], { ...o, y: 'ms', positive: true }),
  };
  window.andreaCharts = charts;   // tests read the plots' tick labels
  $('smoothing').addEventListener('input', redraw);
  $('logscale').addEventListener('change', () => {
    for (const ch of allCharts()) ch.setLog($('logscale').checked);
    redraw();
  });
  $('xaxis').addEventListener('change', () => {
    for (const ch of allCharts()) ch.setX($('xaxis').value);
    redraw();
  });
}

/** The bandit's per-source charts, once the run's sources and phases are known. */
async function loadSources() {
  const res = await fetch(`/api/runs/${runId}/data`);
  if (!res.ok) return;
  const fresh = await res.json();
  const first = !dataInfo;
  dataInfo = fresh;
  if (first) {
    const parent = $('source-charts');
    parent.hidden = false;
    const spec = dataInfo.sources.map((name, i) => ({ label: name, color: COLORS[i % COLORS.length],
      dash: DASHES[Math.floor(i / COLORS.length) % DASHES.length] }));
    const o = { marks, placeholder: 'Waiting for the first step…', x: $('xaxis').value };
    sourceCharts = {
      loss: new Chart(parent, 'loss per source', spec, { ...o, y: 'loss (nats/token)', positive: true }),
      weight: new Chart(parent, 'sampling weight per source', spec, { ...o, y: 'share of the batch' }),
    };
  }
  redraw();
}

function showRun(run) {
  config = run.config;
  if (run.checkpoint?.last_step) {
    stat('last checkpoint', `step ${run.checkpoint.last_step}`, 'last checkpoint', 'setup');
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
  runStatus = run.status;
  if (watching) {
    viewedRun = run;
    trainerHere = run.connected;
    stepAtRun = run.last_step ?? 0;
    showViewedStatus();
  } else {
    $('why').textContent = run.message && ['interrupted', 'stopped', 'failed'].includes(run.status)
      ? `: ${run.message}` : '';
  }
  if (run.name) {
    $('run-name').textContent = run.name;
    document.title = `${run.name} · Andrea`;
    if (!$('edit-name').matches(':focus')) $('edit-name').value = run.name;
  }
  if (run.tags) {
    $('tags').replaceChildren(...run.tags.map((t) => Object.assign(document.createElement('span'),
      { className: 'tag', textContent: t })));
    if (!$('edit-tags').matches(':focus')) $('edit-tags').value = run.tags.join(', ');
  }
  if (run.notes !== undefined && !$('edit-notes').matches(':focus')) $('edit-notes').value = run.notes ?? '';
  if (run.has_weights) showModelLink();
  stat('preset', run.model_name ?? config.preset, 'model', 'setup');
  if (!trainTokens) fetch(`/api/corpus?vocab_size=${config.vocab_size}`).then((r) => (r.ok ? r.json() : null)).then((c) => {
    // Only the run's sources feed it (config.sources; null: every one).
    if (c) trainTokens = c.sources.filter((s) => !config.sources || config.sources.includes(s.name))
      .map((s) => ({ name: s.name, n: s.train_tokens }));
  }).catch(() => {});
  stat('sources', config.sources?.join(', ') ?? 'all', 'sources', 'setup');
  stat('optimizer', config.optimizer + (config.f16_mirror ? ' + f16 mirror' : ''), 'optimizer', 'setup');
  stat('optimizer state', fmtBytes(run.state_bytes), 'optimizer state', 'setup');
  stat('clipping', config.clip ? `max_norm ${config.max_norm}` : 'off', 'clipping', 'setup');
  stat('batch', `${config.batch_size} × ${config.seq_len} tokens`, 'batch', 'setup');
  if (run.adapter) {
    stat('adapter', `${run.adapter.vendor} ${run.adapter.architecture}`.trim() +
      (run.adapter.software ? ' (software)' : ''), 'adapter', 'setup');
  }
  body.dataset.status = run.status;
  if (['finished', 'stopped', 'failed', 'interrupted', 'abandoned'].includes(run.status)) {
    const why = run.status === 'abandoned' ? 'Never started: no training tab took this run.'
      : 'No steps were recorded.';
    for (const ch of allCharts()) if (!series.length) ch.setPlaceholder(why);
  }
  showLast();
}

async function train(run, token) {
  $('mode').textContent = '(training in this tab)';
  const socket = new TrainerSocket(runId, token, {
    onState: (s, why) => { body.dataset.socket = s; if (s === 'refused') showError(`Server refused: ${why}`); },
  });
  trainerSocket = socket;
  const ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE),
    onError: (m) => showError(`GPU error: ${m}`), onLost: (m) => showError(m) });
  const { info, software } = ctx;
  const adapter = { vendor: info.vendor, architecture: info.architecture,
    description: info.description, software };
  stat('adapter', `${info.vendor} ${info.architecture}${software ? ' (software)' : ''}`, 'adapter', 'setup');
  const [layout, maps, tok] = await Promise.all([
    fetch(`/api/runs/${runId}/layout`).then((r) => r.json()),
    fetch('/api/optimizer/maps').then((r) => r.json()),
    fetch(`/api/tokenizer/${config.vocab_size}`).then((r) => r.json()),
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
  for (const ch of allCharts()) ch.setPlaceholder('Compiling kernels: the first step appears here soon…');
  const uploader = new CheckpointUploader(token, socket);
  const trainer = await Trainer.create({
    ctx, layout, config, maps, decode: utf8Decoder(tok), checkpoint: run.checkpoint, resume,
    loadBatch: (step) => fetchBody(`/api/runs/${runId}/batches/${step}`),
    loadValBatch: (i) => fetchBody(`/api/runs/${runId}/val_batches/${i}`),
    on: {
      checkpoint: (ckpt) => uploader.upload(ckpt),
      record: (r) => {
        socket.push(r);
        addRecords([r]);
        if (r.phase !== undefined && dataInfo && !dataInfo.phases.some((p) => p.index === r.phase)) {
          loadSources().catch(() => {});
        }
      },
      sample: (step, text) => { socket.send({ type: 'sample', step, text }); addSample(step, text); },
      status: (status, message) => {
        body.dataset.status = status;
        runStatus = status;
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
  $('mode').textContent = '(trained in this tab)';
  stat('ring waits', `${trainer.stats.ringWaits} (GPU starved ${trainer.stats.gpuStarved})`,
    'readback ring waits', true);
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
  constructor(token, socket) {
    this.token = token;
    this.socket = socket;
  }

  async upload(ckpt) {
    const t0 = performance.now();
    try {
      // Record K first: a checkpoint of step K is only useful with steps 1..K committed (the
      // server resumes only from such a checkpoint).
      await this.socket.committed(ckpt.step);
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

/** A watched run's state in words (run_status.js): "never started", "no training tab", ... */
function showViewedStatus() {
  const run = viewedRun;
  const label = statusLabel(run, trainerHere);
  const cls = { 'never started': 'bad', 'no training tab': 'bad', failed: 'bad' }[label] ?? '';
  setStatus(label, cls);
  $('why').textContent = statusNote(run, trainerHere);
  $('mode').textContent = run.status === 'abandoned' ? '' : '(watching)';
  body.dataset.shownStatus = label;
  showLast();
}

function view() {
  watch(runId, (msg) => {
    if (msg.type === 'records') {
      addRecords(msg.records);
      const ph = msg.records[msg.records.length - 1]?.phase;
      if (ph !== undefined && dataInfo && !dataInfo.phases.some((p) => p.index === ph)) {
        loadSources().catch(() => {});
      }
    } else if (msg.type === 'run') showRun(msg.run);
    else if (msg.type === 'deleted') {
      setStatus('This run was deleted.', 'bad');
      body.dataset.status = 'deleted';
    }
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
  const saved = JSON.parse(sessionStorage.getItem(`andrea.run.${runId}`) || 'null');
  // A run made in this tab that expired to `abandoned` before it started may still train here.
  const mine = saved && (run.status === 'created'
    || (run.status === 'abandoned' && run.last_step === null && !run.checkpoint?.last_step));
  watching = !mine;
  makeCharts(mine ? 'Starting: the first step appears here…' : 'Waiting for the first step…');
  showRun(run);
  $('edit').addEventListener('submit', saveEdit);
  if (run.config.data_mode === 'bandit') loadSources().catch(() => {});
  $('resume-run').onclick = resumeHere;
  if (mine) {
    if (run.checkpoint?.last_step) {   // a resumed run: the steps before its checkpoint
      addRecords(await (await fetch(`/api/runs/${runId}/metrics`)).json());
      resumedAt(run.checkpoint.last_step, false);
    }
    try {
      await train(run, saved.token);
    } catch (e) {
      showError(`Cannot train here: ${e.message}`);
      // Before its first step (no WebGPU, a GPU too small): the server sees no training tab,
      // so the run reads "never started" (or, resumed, interrupted) and another tab may take it.
      trainerSocket?.close();
      body.dataset.done = 'failed';
      throw e;
    }
  } else {
    view();
  }
}

/** Name, tags and notes (PATCH /api/runs/{id}: no token needed, see server/routes/runs.py). */
async function saveEdit(event) {
  event.preventDefault();
  const tags = $('edit-tags').value.split(',').map((t) => t.trim()).filter(Boolean);
  const res = await fetch(`/api/runs/${runId}`, { method: 'PATCH',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ name: $('edit-name').value, tags, notes: $('edit-notes').value }) });
  const out = await res.json().catch(() => ({}));
  if (!res.ok) {
    $('edit-status').textContent = `Not saved: ${typeof out.detail === 'string' ? out.detail
      : (out.detail ?? []).map((d) => d.msg).join('; ')}`;
    return;
  }
  $('edit-status').textContent = 'Saved.';
  showRun({ ...out, has_weights: undefined });
}


main();
