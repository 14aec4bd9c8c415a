// The run page's "Inside the model" card: what each eval step recorded of the model's inside
// (server/metrics.py: resid_rms, mlp_dead, mlp_hist, update_ratio), as small multiples beside
// the gradient heatmap: the residual stream's RMS where each norm reads it, each MLP's dead-unit
// share and its activations' histogram at the newest eval, and each tensor's update-to-weight
// ratio, one chart per layer. The line charts share the page's x axis, zoom and cursor
// (charts.js); the data shaping is inside_data.js. Shown once a record carries the inside.
import uPlot from 'uplot';   // templates/base.html's import map
import { fetchJson } from './api.js';
import { COLORS, Chart, DASHES, Throttle } from './charts.js';
import { fieldColumns, insideLayout, insideRows, shares } from './inside_data.js';
import { paletteColor } from './heatmap_data.js';
import { routePath } from './facts.js';

const $ = (id) => document.getElementById(id);
const REDRAW_MS = 500;
// The histogram's x labels: a few of its 16 bins (server/metrics.py mlp_hist_labels).
const HIST_TICKS = [[0, '≤-3'], [4, '-0.1'], [7.5, '0'], [11, '0.1'], [15, '≥3']];

export class InsideView {
  constructor(runId, series) {
    this.runId = runId;
    this.series = series;
    this.rows = insideRows();
    this.asked = false;
    this.layout = null;      // insideLayout() of the run's parameter table
    this.lines = [];         // the line charts (the page's log and x-axis switches reach them)
    this.hists = [];         // per layer: its histogram's uPlot
    this.xs = [];
    this.redraw = new Throttle(REDRAW_MS, () => this.draw());
  }

  /** The series changed from row `from`; xs: the page's x per row (steps or elapsed time). */
  update(xs, from) {
    this.xs = xs;
    const { rows } = this.rows.update(this.series, from);
    if (this.layout) this.redraw.request();
    else if (!this.asked && rows.length) this.ask();
  }

  ask() {
    this.asked = true;
    fetchJson(routePath('get_run_layout', { run_id: this.runId })).then((layout) => {
      this.layout = insideLayout(layout.params);
      this.make();
    }).catch((e) => console.warn('no inside view: the run\'s layout is unavailable', e));
  }

  make() {
    const { norms, layers, groups } = this.layout;
    $('inside-card').hidden = false;
    const x = $('xaxis').value;
    const log = $('logscale').checked;
    // Deeper is lighter; a norm after attention dashed.
    const depth = (i, n) => paletteColor(0.1 + 0.8 * (i / Math.max(1, n - 1)));
    this.resid = new Chart($('inside-resid'), 'residual stream RMS', norms.map((label, i) => ({
      label, color: depth(i, norms.length), dash: label.includes('after') ? DASHES[1] : undefined })),
    { y: 'RMS at the norm\'s input', positive: true, log, x, height: 240 });
    this.dead = new Chart($('inside-resid'), 'dead MLP units', layers.map((label, i) => ({
      label, color: COLORS[i % COLORS.length] })), { y: 'share of units (|h| < 1% of RMS)', x, height: 240 });
    this.updates = groups.map((g) => new Chart($('inside-updates'), `update / weight: ${g.layer}`,
      g.labels.map((label, i) => ({ label, color: COLORS[i % COLORS.length] })),
      // Ratios span decades (a norm gain's and a projection's): on a log scale from the start.
      { y: '‖Δw‖ / ‖w‖', positive: true, log: true, x, height: 180 }));
    this.lines = [this.resid, this.dead, ...this.updates];
    this.hists = layers.map((label) => histogram($('inside-hists'), label));
    window.andreaInside = this;     // tests read the charts
    this.redraw.request(true);
  }

  charts() {
    return this.lines;
  }

  draw() {
    const { rows } = this.rows.state;
    const s = this.series;
    const { norms, layers, groups } = this.layout;
    const idx = (n) => [...Array(n).keys()];
    this.resid.setData(fieldColumns(s, rows, this.xs, 'resid_rms', idx(norms.length)));
    this.dead.setData(fieldColumns(s, rows, this.xs, 'mlp_dead', idx(layers.length)));
    this.updates.forEach((chart, g) =>
      chart.setData(fieldColumns(s, rows, this.xs, 'update_ratio', groups[g].members)));
    const last = rows.length ? s.records[rows[rows.length - 1]] : null;
    if (!last) return;
    this.hists.forEach((h, l) => {
      const counts = last.mlp_hist?.[l];
      if (!counts) return;
      h.plot.setData([counts.map((_, i) => i), shares(counts)]);
      h.title.textContent = `${layers[l]}: MLP activations at step ${last.step}` +
        (last.mlp_dead ? `, ${(last.mlp_dead[l] * 100).toFixed(1)}% of units dead` : '');
      h.box.dataset.step = String(last.step);
    });
  }
}

/** A small bar chart of one layer's MLP histogram (shares per bin). */
function histogram(parent, label) {
  const box = document.createElement('div');
  box.className = 'chart inside-hist';
  box.dataset.chart = `histogram ${label}`;
  const title = document.createElement('h3');
  title.textContent = `${label}: MLP activations`;
  box.append(title);
  parent.append(box);
  const plot = new uPlot({
    width: 260, height: 150,
    scales: { x: { time: false, range: [-0.5, 15.5] },
      y: { range: (u, min, max) => [0, Math.max(0.05, max * 1.1)] } },
    series: [{ label: 'bin' }, { label: 'share', fill: '#2a6df4aa', stroke: '#2a6df4',
      paths: uPlot.paths.bars({ size: [0.9, 40] }), points: { show: false } }],
    axes: [{ splits: () => HIST_TICKS.map(([v]) => v), values: () => HIST_TICKS.map(([, t]) => t),
      size: 28 }, { size: 48 }],
    legend: { show: false }, cursor: { show: false },
  }, [[], []], box);
  return { box, title, plot };
}
