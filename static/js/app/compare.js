// Compare page: the chosen runs overlaid (loss, eval loss, grad norm, learning rate, step and
// optimizer time), each run in its own colour and dash (a room run: its global eval loss at
// the same total tokens); the difference of each run's loss to a baseline run (fp32 AdamW by
// default, chosen in a select); a summary table and the settings in which the runs differ; the gradient norm of one layer (compare_layers.js). While a run may
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

/** fp32 AdamW (without the f16 mirror) when one is there, else the first run. */
function defaultBaseline(found) {
  const fp32 = found.find((r) => r.run.config.optimizer === 'adamw' && !r.run.config.f16_mirror)
    ?? found.find((r) => r.run.config.optimizer === 'adamw');
  return (fp32 ?? found[0]).id;
}

/** A run's legend label; the clip mode too where the runs differ in it and the name does not
 *  already say it (the clipping experiment's runs are named for theirs). */
function labeller(found) {
  const clipDiffers = new Set(found.map((r) => r.run.config.clip_mode)).size > 1;
  return (r) => {
    const { name, config } = r.run;
    const clip = clipWords(config.clip_mode, 'name');
    const says = clipDiffers && !name.includes(clip) ? `, ${clip}` : '';
    const room = config.room ? `, a room of its workers: x its tokens in one browser's steps` : '';
    return `${shownText(name)} (${config.optimizer}${config.f16_mirror ? ' + f16' : ''}${says}${room})`;
  };
}

/** Each id's run and its records ({id, run: null, metrics: []} for an unknown run); a room
 *  run's are roomRecords. */
function fetchRuns() {
  return Promise.all(ids.map(async (id) => {
    const [run, metrics] = await Promise.all([
      fetchJson(routePath('get_run', { run_id: id })).catch(() => null),          // "no such run" in the table
      fetchJson(routePath('get_metrics', { run_id: id })).catch(() => []),
    ]);
    if (run?.config.room) return { id, run, metrics: await roomRecords(id) };
    return { id, run, metrics };
  }));
}

/** A room run beside one-browser runs at the same total tokens: each global version's eval
 *  loss (the median of its workers' measures, the room's evals) at the step a single browser
 *  of the same batch reaches after as many tokens (the inner steps of every pseudo-gradient
 *  averaged into the versions before it). */
async function roomRecords(id) {
  const room = await fetchJson(routePath('get_room', { run_id: id }));
  const H = room.config.inner_steps;
  const steps = [0];   // tokens before version v, in one browser's steps
  for (const round of room.closed) steps[round.version] = steps[round.round] + H * Object.keys(round.workers).length;
  return room.evals.filter((e) => steps[e.version] !== undefined)
    .sort((a, b) => a.version - b.version)
    .map((e) => ({ step: steps[e.version], eval_loss: e.median, version: e.version }));
}

/** One x axis over the union of steps; per key, each run a column with gaps where it has no
 *  step. */
function columns(found) {
  const steps = [...new Set(found.flatMap((r) => r.metrics.map((m) => m.step)))].sort((a, b) => a - b);
  const at = (r, key) => {
    const by = new Map(r.metrics.map((m) => [m.step, m[key]]));
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
    tr.insertCell().textContent = String(metrics.length);
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

/** The settings in which the runs differ (all of them with the box ticked). */
function configDiff(found) {
  const all = $('config-all').checked;
  const keys = [...new Set(found.flatMap((r) => Object.keys(r.run.config)))].sort();
  const show = (v) => (v === undefined ? '–' : v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v));
  const head = document.querySelector('#config-diff thead');
  const body = document.querySelector('#config-diff tbody');
  head.replaceChildren();
  const hr = head.insertRow();
  hr.append(Object.assign(document.createElement('th'), { textContent: 'setting' }),
    ...found.map((r) => setShown(document.createElement('th'), r.run.name)));
  body.replaceChildren();
  let differing = 0;
  for (const k of keys) {
    const vals = found.map((r) => show(r.run.config[k]));
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

  let { steps, cols } = columns(found);
  const style = (r, i) => ({ label: label(r), color: COLORS[i % COLORS.length],
    dash: DASHES[i % DASHES.length] });
  const parent = $('charts');
  const spec = found.map(style);
  const o = { group: 'compare', placeholder: 'No steps recorded.' };
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
  const layers = new LayerOverlay(spec);
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
    layers.draw(found, steps, (c) => smooth(c, alpha));
    showTrainLinks($('train-links'), found);
  };
  // Runs that may still change: read again (the same runs; a deleted one keeps its last).
  const refresh = async () => {
    if (!found.some((r) => LIVE.includes(r.run.status))) return;
    await new Promise((r) => setTimeout(r, REFRESH_MS));
    runs = await fetchRuns();
    for (const r of found) {
      const fresh = runs.find((x) => x.id === r.id);
      if (fresh?.run) Object.assign(r, { run: fresh.run, metrics: fresh.metrics });
    }
    ({ steps, cols } = columns(found));
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
  document.body.dataset.ready = '1';
  refresh().catch((e) => console.warn('compare: refresh stopped', e));
}

main();
