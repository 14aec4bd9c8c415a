// The run page's charts (uPlot, through charts.js): loss, gradient norm, clip scale, learning
// rate, speed and step time over the page's RunSeries (series.js), and with the source bandit
// each source's loss and its sampling weight per phase. Derived columns (smoothing, clip events,
// the wall-clock axis) extend over the new rows only, and every chart redraws once per
// animation frame, for live records at most every LIVE_REDRAW_MS. Marks: the bandit's phase
// changes and the steps the run was resumed from.
// Records with per-tensor gradient norms also get the heatmap (heatmap.js), on the same x, and
// eval records with the model's inside its small multiples (inside_view.js).
import { fetchJson } from './api.js';
import { COLORS, Chart, DASHES, Throttle } from './charts.js';
import { GradHeatmap } from './heatmap.js';
import { InsideView } from './inside_view.js';
import {
  Derived, clipEvents, elapsedColumn, phaseMarks, rowOf, runningSmooth, sourceColumns,
} from './series.js';
import { stat } from './run_view.js';
import { routePath } from './facts.js';

const $ = (id) => document.getElementById(id);

// Live records redraw the charts at most this often. Redrawn at every animation frame, a page
// training a fast model redrew six charts 60 times a second, and that raster work shares the GPU
// with the training: a 12m mixed-precision step took 13.2-13.7 ms of GPU time in the page on an
// H100, 12.3-12.7 with the page's drawing kept off the GPU (bench/results/app_loop_h100.txt).
const LIVE_REDRAW_MS = 100;

/** The record fields the run page keeps as columns (its RunSeries). */
export const RUN_COLUMNS = ['loss', 'eval_loss', 'eval_acc', 'grad_norm', 'clip_scale', 'lr', 'tokens_per_s',
  'step_ms', 'opt_ms'];

export class RunCharts {
  /** series: the page's RunSeries; placeholder: what a chart says before the first step. */
  constructor(runId, series, placeholder) {
    this.runId = runId;
    this.series = series;
    this.config = null;          // the run's config (the max_norm line): setConfig
    this.frame = null;           // the pending animation frame, if any
    this.frames = new Throttle(LIVE_REDRAW_MS,
      () => { this.frame ??= requestAnimationFrame(() => this.draw()); });
    this.alpha = null;           // the smoothing of this.smoothed
    this.smoothed = null;        // {loss, speed, sources: [per source]}: running EMAs
    this.clips = clipEvents();
    this.phases = phaseMarks();
    this.sources = sourceColumns();
    this.elapsed = elapsedColumn();
    // Only a global clip's threshold is one for the global norm (per tensor: each tensor's).
    this.maxNormLine = new Derived(() => [],
      (line) => line.push(this.config?.clip_mode === 'global' ? this.config.max_norm : null));
    this.dataInfo = null;        // GET /api/runs/{id}/data: the sources and the bandit's phases so far
    this.sourceCharts = null;    // made once the sources are known (loadSources)
    this.resumes = [];           // steps the run was resumed from
    this.spikeSteps = new Set(); // the run's gradient spikes (spikes.js): setSpikes
    this.spikeCol = [];          // per row: its grad norm where its step is a spike, else null
    const parent = $('charts');
    const o = { marks: () => this.marks(), placeholder };
    this.charts = {
      loss: new Chart(parent, 'loss', [{ label: 'train' }, { label: 'smoothed', color: '#0b3d91' },
        { label: 'eval', color: '#e8710a', points: true }], { ...o, y: 'loss (nats/token)', positive: true }),
      norm: new Chart(parent, 'gradient norm', [{ label: 'grad norm' },
        { label: 'max_norm', color: '#b3261e', dash: [6, 4] },
        { label: 'clipped', color: '#b3261e', points: true },
        { label: 'spike', color: '#6a1b9a', points: true }], { ...o, y: 'global L2 norm', positive: true }),
      clip: new Chart(parent, 'clip scale', [{ label: 'clip scale', color: '#0a7d38' }],
        { ...o, y: 'scale (1: not clipped)' }),
      lr: new Chart(parent, 'learning rate', [{ label: 'lr', color: '#8e44ad' }],
        { ...o, y: 'learning rate', positive: true }),
      speed: new Chart(parent, 'speed', [{ label: 'tokens/s', color: '#00838f' }],
        { ...o, y: 'tokens / s', positive: true }),
      time: new Chart(parent, 'step time', [{ label: 'step', color: '#5d4037' },
        { label: 'optimizer (GPU)', color: '#c2185b' }], { ...o, y: 'ms', positive: true }),
    };
    this.heatmap = new GradHeatmap(runId, series);
    this.inside = new InsideView(runId, series);
    window.andreaCharts = this.charts;   // tests read the plots' tick labels
    $('smoothing').addEventListener('input', () => this.redraw());
    $('logscale').addEventListener('change', () => {
      for (const ch of this.all()) ch.setLog($('logscale').checked);
      this.redraw();
    });
    $('xaxis').addEventListener('change', () => {
      for (const ch of this.all()) ch.setX($('xaxis').value);
      this.redraw();
    });
  }

  all() {
    return [...Object.values(this.charts), ...Object.values(this.sourceCharts ?? {}),
      ...(this.heatmap.chart ? [this.heatmap.chart] : []), ...this.inside.charts()];
  }

  setConfig(config) {
    this.config = config;
    // A toy task run: its exact-match accuracy on held-out problems, right after the loss.
    if (config.task && !this.charts.accuracy) {
      const acc = new Chart($('charts'), 'accuracy', [{ label: 'exact match', color: '#0a7d38',
        points: true }], { marks: () => this.marks(), placeholder: 'Waiting for the first eval…',
        y: `exact, held-out ${config.task}`, x: $('xaxis').value });
      this.charts.loss.box.after(acc.box);
      this.charts.accuracy = acc;
      this.redraw();
    }
  }

  /** What every chart says while it has no data. */
  setPlaceholder(text) {
    for (const ch of this.all()) ch.setPlaceholder(text);
  }

  /** The steps that are gradient spikes, marked on the grad norm chart. */
  setSpikes(steps) {
    this.spikeSteps = new Set(steps);
    this.spikeCol = [];
    this.schedule(true);
  }

  /** The charts zoomed around `step` with the cursor on it (a spike opened in the list). The
   *  zoom and the cursor go to the others through the group (charts.js). */
  focusStep(step) {
    const plot = this.charts.norm.plot;
    const xs = plot.data[0];
    const row = rowOf(this.series, step);
    if (row < 0 || row >= xs.length) return;
    const half = Math.max(10, Math.round(xs.length / 40));
    plot.setScale('x', { min: xs[Math.max(0, row - half)], max: xs[Math.min(xs.length - 1, row + half)] });
    plot.setCursor({ left: plot.valToPos(xs[row], 'x'), top: plot.bbox.height / devicePixelRatio / 2 },
      true, true);
  }

  /** Draw on an animation frame: live rows (the series has new ones) at most LIVE_REDRAW_MS
   *  after the last draw, `soon` (what the user changed) on the next frame. */
  schedule(soon = false) {
    if (!this.frame) this.frames.request(soon);
  }

  /** Redraw everything on the next frame (smoothing, scale or x axis changed). */
  redraw() {
    this.series.changedFrom = 0;
    this.schedule(true);
  }

  /** The run was resumed from its checkpoint at `step`: a mark. */
  resumedAt(step) {
    if (!this.resumes.includes(step)) this.resumes.push(step);
  }

  /** One frame: bring the derived columns up to date, then one setData per chart. */
  draw() {
    this.frame = null;
    const { series, charts } = this;
    const from = series.takeChanged();
    const alpha = Number($('smoothing').value);
    if (alpha !== this.alpha) {
      this.alpha = alpha;
      this.smoothed = { loss: runningSmooth('loss', alpha), speed: runningSmooth('tokens_per_s', alpha),
        sources: [] };
      $('smoothing-value').textContent = alpha.toFixed(2);
    }
    const c = series.cols;
    const clipped = this.clips.update(series, from);
    const t = this.elapsed.update(series, from).out;
    const xs = $('xaxis').value === 'time' ? t : series.steps;
    this.phases.update(series, from);
    charts.loss.setData([xs, c.loss, this.smoothed.loss.update(series, from).out, c.eval_loss]);
    charts.accuracy?.setData([xs, c.eval_acc]);
    this.spikeCol.length = Math.min(this.spikeCol.length, from);
    for (let i = this.spikeCol.length; i < series.length; i++) {
      this.spikeCol.push(this.spikeSteps.has(series.steps[i]) ? c.grad_norm[i] : null);
    }
    charts.norm.setData([xs, c.grad_norm, this.maxNormLine.update(series, from), clipped.norm,
      this.spikeCol]);
    charts.clip.setData([xs, c.clip_scale]);
    charts.lr.setData([xs, c.lr]);
    charts.speed.setData([xs, this.smoothed.speed.update(series, from).out]);
    charts.time.setData([xs, c.step_ms, c.opt_ms]);
    if (this.sourceCharts) this.drawSources(xs, from);
    this.heatmap.update(xs, from);
    this.inside.update(xs, from);
    stat('clipped steps', `${clipped.count} of ${series.length}`);
  }

  /** The bandit's view: each source's (smoothed) training loss, and its sampling weight per
   *  phase (GET /api/runs/{id}/data) drawn as steps. */
  drawSources(xs, from) {
    const { series } = this;
    this.sources.update(series, from);
    const names = this.dataInfo.sources;
    const smoothed = this.smoothed.sources;
    this.sourceCharts.loss.setData([xs, ...names.map((_, i) => {
      // (the columns' state as it is now: a rebuild replaces it)
      smoothed[i] ??= runningSmooth((_s, row) => this.sources.state.cols[i]?.[row], this.alpha);
      return smoothed[i].update(series, from).out;
    })]);
    const wx = [];
    const wy = names.map(() => []);
    const onTime = $('xaxis').value === 'time';
    for (const ph of this.dataInfo.phases) {
      for (const step of [ph.start + 1, ph.start + ph.length]) {
        wx.push(onTime ? xs[rowOf(series, step)] ?? null : step);
        ph.weights.forEach((w, i) => wy[i].push(w));
      }
    }
    const keep = wx.map((x) => x !== null);
    this.sourceCharts.weight.setData([wx.filter((_, i) => keep[i]),
      ...wy.map((col) => col.filter((_, i) => keep[i]))]);
  }

  /** Chart marks: bandit phase changes (from the records, and every phase the server decided)
   *  and resumes. */
  marks() {
    const out = [...this.phases.state.marks, ...this.resumes];
    if (this.dataInfo) for (const ph of this.dataInfo.phases) if (ph.index > 0) out.push(ph.start + 1);
    if ($('xaxis').value !== 'time') return out;
    const t = this.elapsed.state.out;   // the marks' steps on the wall-clock axis
    return out.map((step) => t[rowOf(this.series, step)]).filter((x) => x !== undefined);
  }

  /** A record of bandit phase `phase`: the sources' data again when it is a phase not yet known. */
  phaseSeen(phase) {
    if (phase !== undefined && this.dataInfo && !this.dataInfo.phases.some((p) => p.index === phase)) {
      this.loadSources().catch(() => {});
    }
  }

  /** The bandit's per-source charts, once the run's sources and phases are known. */
  async loadSources() {
    const fresh = await fetchJson(routePath('run_data', { run_id: this.runId }));
    const first = !this.dataInfo;
    this.dataInfo = fresh;
    if (first) {
      const parent = $('source-charts');
      parent.hidden = false;
      const spec = fresh.sources.map((name, i) => ({ label: name, color: COLORS[i % COLORS.length],
        dash: DASHES[Math.floor(i / COLORS.length) % DASHES.length] }));
      const o = { marks: () => this.marks(), placeholder: 'Waiting for the first step…', x: $('xaxis').value };
      this.sourceCharts = {
        loss: new Chart(parent, 'loss per source', spec, { ...o, y: 'loss (nats/token)', positive: true }),
        weight: new Chart(parent, 'sampling weight per source', spec, { ...o, y: 'share of the batch' }),
      };
    }
    this.redraw();
  }
}
