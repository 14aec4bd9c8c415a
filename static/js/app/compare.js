// Compare page: the chosen runs overlaid (loss, eval loss, grad norm, learning rate, step and
// optimizer time), each run in its own colour and dash; with a room run among them the x axis
// is tokens trained (a room's: every worker's together; a one-browser run's: its steps x batch
// x context), else steps. The difference of each run's loss to a baseline run (fp32 AdamW by
// default, a one-browser run over a room; chosen in a select); a summary table and the settings
// in which the runs differ (a room's each its own row); the gradient norm of one layer
// (compare_layers.js). While a run may
// still change the page reads them again every REFRESH_MS, and offers the runs made in this tab
// that wait for a training tab (compare_train.js).
import { fetchJson } from './api.js';
import { COLORS, Chart, DASHES, fmtBytes } from './charts.js';
import { clipWords, routePath } from './facts.js';
import { LayerOverlay } from './compare_layers.js';
import { showTrainLinks } from './compare_train.js';
import { smooth } from './series.js';
import { setShown, shownText } from './text.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const ids = (params.get('ids') || '').split(',').filter(Boolean);
const tbody = document.querySelector('#summary tbody');
const REFRESH_MS = 10_000;
const LIVE = ['created', 'running', 'paused'];     // statuses whose records may still grow

function median(xs) {
  const s = xs.filter((x) => x !== null && x !== undefined).sort((a, b) => a - b);
  return s.length ? s[s.length >> 1] : null;
}

/** A run's recorded losses (non-finite steps are stored as null). */
const finiteLosses = (metrics) => metrics.map((m) => m.loss)
  .filter((x) => x !== null && x !== undefined);

/** Mean training loss over a run's last 10 recorded steps (null if none). */
function tailMean(losses) {
  const l = losses.slice(-10);
  return l.length ? l.reduce((a, b) => a + b, 0) / l.length : null;
}

/** fp32 AdamW (without the f16 mirror) when one is there, else the first run; a one-browser
 *  run before a room run (a room has no training loss of its own to be the reference of). */
function defaultBaseline(found) {
  const single = found.filter((r) => !r.run.config.room);
  const pool = single.length ? single : found;
  const fp32 = pool.find((r) => r.run.config.optimizer === 'adamw' && !r.run.config.f16_mirror)
    ?? pool.find((r) => r.run.config.optimizer === 'adamw');
  return (fp32 ?? pool[0]).id;
}

/** Tokens one step of a one-browser run trains: its batch of rows of its context. */
const tokensPerStep = (config) => config.batch_size * config.seq_len;

/** A run's legend label; the clip mode too where the runs differ in it and the name does not
 *  already say it (the clipping experiment's runs are named for theirs). */
function labeller(found) {
  const clipDiffers = new Set(found.map((r) => r.run.config.clip_mode)).size > 1;
  return (r) => {
    const { name, config } = r.run;
    const clip = clipWords(config.clip_mode, 'name');
    const says = clipDiffers && !name.includes(clip) ? `, ${clip}` : '';
    const room = config.room ? ', room run: its workers\' tokens together' : '';
    return `${shownText(name)} (${config.optimizer}${config.f16_mirror ? ' + f16' : ''}${says}${room})`;
  };
}

/** Each id's run and its records ({id, run: null, metrics: []} for an unknown run); a room
 *  run's are roomRecords, and `room` its room. */
function fetchRuns() {
  return Promise.all(ids.map(async (id) => {
    const [run, metrics] = await Promise.all([
      fetchJson(routePath('get_run', { run_id: id })).catch(() => null),          // "no such run" in the table
      fetchJson(routePath('get_metrics', { run_id: id })).catch(() => []),
    ]);
    if (run?.config.room) {
      const room = await fetchJson(routePath('get_room', { run_id: id }));
      return { id, run, room, metrics: roomRecords(room, run.config) };
    }
    return { id, run, metrics };
  }));
}

/** A room run's records: each global version's eval loss (the median of its workers'
 *  measures, the room's evals) at the tokens the room trained before it, every worker's
 *  together: each closed round's H inner steps of each worker whose pseudo-gradient it took,
 *  of batch x context tokens each. */
function roomRecords(room, config) {
  const perRound = room.config.inner_steps * tokensPerStep(config);
  const tokens = [0];   // tokens before version v
  for (const round of [...room.closed].sort((a, b) => a.round - b.round)) {
    tokens[round.version] = tokens[round.round] + perRound * Object.keys(round.workers).length;
  }
  return room.evals.filter((e) => tokens[e.version] !== undefined)
    .sort((a, b) => a.version - b.version)
    .map((e) => ({ step: e.version, tokens: tokens[e.version], eval_loss: e.median, version: e.version }));
}

/** Where a record goes on the x axis: its step, or with a room among the runs (`tokens`) the
 *  tokens trained by then (a one-browser run's steps x batch x context; a room's all its
 *  workers'). */
const xOf = (r, m, tokens) => (!tokens ? m.step
  : r.run.config.room ? m.tokens : m.step * tokensPerStep(r.run.config));

/** One x axis over the union of the runs' x; per key, each run a column with gaps where it has
 *  no record there. */
function columns(found, tokens) {
  const steps = [...new Set(found.flatMap((r) => r.metrics.map((m) => xOf(r, m, tokens))))].sort((a, b) => a - b);
  const at = (r, key) => {
    const by = new Map(r.metrics.map((m) => [xOf(r, m, tokens), m[key]]));
    return steps.map((s) => by.get(s) ?? null);
  };
  const cols = Object.fromEntries(['loss', 'eval_loss', 'grad_norm', 'lr', 'step_ms', 'opt_ms']
    .map((k) => [k, found.map((r) => at(r, k))]));
  return { steps, cols };
}

function summary(runs, found, base) {
  const ref = base ? tailMean(finiteLosses(base.metrics)) : null;
  tbody.replaceChildren();
  for (const { id, run, metrics } of runs) {
    const tr = tbody.insertRow();
    tr.dataset.runId = id;
    if (!run) { tr.insertCell().textContent = `${id}: no such run`; continue; }
    if (base && id === base.id) tr.className = 'baseline';
    const losses = finiteLosses(metrics);
    const a = document.createElement('a');
    a.href = routePath('run_page', { run_id: id });
    setShown(a, run.name);
    const i = found.findIndex((r) => r.id === id);
    const swatch = document.createElement('span');
    swatch.textContent = '━ ';
    swatch.style.color = COLORS[i % COLORS.length];
    tr.insertCell().append(swatch, a);
    tr.insertCell().textContent = run.config.optimizer + (run.config.f16_mirror ? ' + f16' : '');
    const room = runs.find((x) => x.id === id)?.room;
    tr.insertCell().textContent = room ? `${room.version} of ${room.rounds} rounds`
      : String(metrics.length);
    const ck = run.checkpoint?.last_step;
    tr.insertCell().textContent = ck ? `step ${ck}${run.can_resume ? ' · resumable' : ''}` : '-';
    tr.insertCell().textContent = losses.length ? losses[losses.length - 1].toFixed(4) : '-';
    tr.insertCell().textContent = losses.length ? Math.min(...losses).toFixed(4) : '-';
    const evals = metrics.map((m) => m.eval_loss).filter((x) => x !== undefined && x !== null);
    tr.insertCell().textContent = evals.length ? evals[evals.length - 1].toFixed(4) : '-';
    tr.insertCell().textContent = fmtBytes(run.state_bytes);
    const ms = median(metrics.map((m) => m.step_ms));
    tr.insertCell().textContent = ms === null ? '-' : `${ms.toFixed(1)} ms`;
    const opt = median(metrics.map((m) => m.opt_ms));   // GPU time, where timestamp-query exists
    tr.insertCell().textContent = opt === null ? '-' : `${opt.toFixed(2)} ms`;
    let gap = '-';
    if (base && id === base.id) gap = 'reference (baseline)';
    else if (ref) {
      const tail = tailMean(losses);
      if (tail !== null) {
        const pct = (tail / ref - 1) * 100;
        gap = `${pct >= 0 ? '+' : ''}${pct.toFixed(2)} %`;
      }
    }
    tr.insertCell().textContent = gap;
  }
}

/** A run's settings as the config table shows them: each its own row, a room run's room
 *  settings each as "room: <name>" (a one-browser run has none: "–"), and "room run" yes/no. */
function settingsOf(config) {
  const out = {};
  for (const [k, v] of Object.entries(config)) {
    if (k === 'room') continue;
    out[k] = v;
  }
  out['room run'] = config.room ? 'yes' : 'no';
  for (const [k, v] of Object.entries(config.room ?? {})) out[`room: ${k}`] = v;
  return out;
}

/** The settings in which the runs differ (all of them with the box ticked). */
function configDiff(found) {
  const all = $('config-all').checked;
  const settings = found.map((r) => settingsOf(r.run.config));
  const keys = [...new Set(settings.flatMap((c) => Object.keys(c)))].sort();
  const show = (v) => (v === undefined ? '–' : Array.isArray(v) ? v.join(', ')
    : v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v));
  const head = document.querySelector('#config-diff thead');
  const body = document.querySelector('#config-diff tbody');
  head.replaceChildren();
  const hr = head.insertRow();
  hr.append(Object.assign(document.createElement('th'), { textContent: 'setting' }),
    ...found.map((r) => setShown(document.createElement('th'), r.run.name)));
  body.replaceChildren();
  let differing = 0;
  for (const k of keys) {
    const vals = settings.map((c) => show(c[k]));
    const differs = new Set(vals).size > 1;
    differing += differs;
    if (!differs && !all) continue;
    const tr = body.insertRow();
    tr.dataset.key = k;
    tr.insertCell().textContent = k;
    for (const v of vals) {
      const td = tr.insertCell();
      td.textContent = v;
      if (differs) td.className = 'differs';
    }
  }
  if (!body.rows.length) {
    body.insertRow().insertCell().textContent = 'The runs have the same settings.';
  }
  $('config-card').dataset.differing = String(differing);
}

async function main() {
  if (!ids.length) {
    $('pick').hidden = false;
    $('compare-body').hidden = true;
    $('charts').hidden = true;
    document.body.dataset.ready = '1';
    return;
  }
  let runs = await fetchRuns();
  const found = runs.filter((r) => r.run);     // the page's runs, as first found (the charts')
  const label = labeller(found);
  const select = $('baseline');
  for (const r of found) select.append(new Option(label(r), r.id));
  const wanted = params.get('baseline');
  select.value = found.some((r) => r.id === wanted) ? wanted : (found.length ? defaultBaseline(found) : '');

  // A room among the runs: one tokens axis (a room's round is many browsers' steps at once).
  const tokens = found.some((r) => r.run.config.room);
  let { steps, cols } = columns(found, tokens);
  const style = (r, i) => ({ label: label(r), color: COLORS[i % COLORS.length],
    dash: DASHES[i % DASHES.length] });
  const parent = $('charts');
  const spec = found.map(style);
  const o = { group: 'compare', placeholder: 'No steps recorded.', x: tokens ? 'tokens' : 'step' };
  const charts = {
    loss: new Chart(parent, 'loss', spec, { ...o, y: 'training loss (nats/token)', positive: true }),
    diff: new Chart(parent, 'difference to baseline', spec,
      { ...o, y: 'loss − baseline loss', zeroLine: true }),
    eval: new Chart(parent, 'eval loss', spec.map((s) => ({ ...s, points: false })),
      { ...o, y: 'eval loss (nats/token)', positive: true }),
    norm: new Chart(parent, 'grad norm', spec, { ...o, y: 'global L2 norm', positive: true }),
    lr: new Chart(parent, 'learning rate', spec, { ...o, y: 'learning rate', positive: true }),
    step: new Chart(parent, 'step time', spec, { ...o, y: 'ms per step', positive: true }),
    opt: new Chart(parent, 'optimizer time (GPU)', spec, { ...o, y: 'ms per step', positive: true }),
  };
  const layers = new LayerOverlay(spec, o.x);
  charts.layer = layers.chart;
  window.andreaCharts = charts;
  await layers.load(found);
  const draw = () => {
    const alpha = Number($('smoothing').value);
    $('smoothing-value').textContent = alpha.toFixed(2);
    const baseIdx = found.findIndex((r) => r.id === select.value);
    const base = found[baseIdx];
    summary(runs, found, base);
    const sm = (k) => cols[k].map((c) => smooth(c, alpha));
    const loss = sm('loss');
    charts.loss.setData([steps, ...loss]);
    const b = loss[baseIdx] ?? [];
    charts.diff.setData([steps, ...loss.map((c, i) => (i === baseIdx ? steps.map(() => null)
      : c.map((v, j) => (v === null || b[j] === null || b[j] === undefined ? null : v - b[j]))))]);
    charts.diff.box.dataset.baseline = select.value;
    charts.eval.setData([steps, ...cols.eval_loss]);
    charts.norm.setData([steps, ...sm('grad_norm')]);
    charts.lr.setData([steps, ...cols.lr]);
    charts.step.setData([steps, ...sm('step_ms')]);
    charts.opt.setData([steps, ...sm('opt_ms')]);
    layers.draw(found, steps, (c) => smooth(c, alpha), (r, m) => xOf(r, m, tokens));
    showTrainLinks($('train-links'), found);
  };
  // Runs that may still change: read again (the same runs; a deleted one keeps its last).
  const refresh = async () => {
    if (!found.some((r) => LIVE.includes(r.run.status))) return;
    await new Promise((r) => setTimeout(r, REFRESH_MS));
    runs = await fetchRuns();
    for (const r of found) {
      const fresh = runs.find((x) => x.id === r.id);
      if (fresh?.run) Object.assign(r, { run: fresh.run, metrics: fresh.metrics, room: fresh.room });
    }
    ({ steps, cols } = columns(found, tokens));
    await layers.load(found);
    draw();
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed ?? 0) + 1);
    refresh();
  };
  layers.select.addEventListener('change', draw);
  $('smoothing').addEventListener('input', draw);
  $('logscale').addEventListener('change', () => {
    for (const ch of Object.values(charts)) ch.setLog($('logscale').checked);
    draw();
  });
  select.addEventListener('change', () => {
    const url = new URL(location.href);
    url.searchParams.set('baseline', select.value);
    history.replaceState(null, '', url);
    draw();
  });
  $('config-all').addEventListener('change', () => configDiff(found));
  if (found.length) {
    $('config-card').hidden = false;
    configDiff(found);
  }
  draw();
  parent.dataset.series = String(found.length);
  parent.dataset.x = o.x;
  document.body.dataset.ready = '1';
  refresh().catch((e) => console.warn('compare: refresh stopped', e));
}

main();
