// The run page's gradient-norm heatmap: one row per layer (or per parameter tensor), steps on x,
// each cell's colour the norm of that row's gradient on a log scale. A uPlot chart (charts.js)
// whose draw hook paints the cells, so it keeps the page's x zoom and cursor; the data shaping
// is heatmap_data.js. Shown once a record carries `tensor_grad_norms` (older runs: never).
import uPlot from 'uplot';   // templates/base.html's import map
import { fetchJson } from './api.js';
import { Chart, Throttle } from './charts.js';
import { fmtValue } from './format.js';
import {
  LEVELS, NONFINITE_COLOR, PALETTE, binColumns, bucketOf, columnAt, hasTensorNorms, heatRows,
  paletteColor, rowColumns, shortName, topTensor,
} from './heatmap_data.js';
import { routePath } from './facts.js';

const $ = (id) => document.getElementById(id);
const REDRAW_MS = 300;    // live, at most one redraw this often: each one bins every shown step
const ROW_PX = { layer: 24, tensor: 13 };
const COLOURS = Array.from({ length: LEVELS }, (_, i) => paletteColor((i + 0.5) / LEVELS));
const TITLES = { layer: 'gradient norm per layer', tensor: 'gradient norm per tensor' };

export class GradHeatmap {
  /** series: the page's RunSeries; its records' tensor_grad_norms follow the run's layout. */
  constructor(runId, series) {
    this.runId = runId;
    this.series = series;
    this.params = null;      // the run's parameter table (name, layer): tensor_grad_norms' order
    this.names = null;       // ... and its names
    this.asked = false;      // the layout was asked for (once: a run without it stays hidden)
    this.chart = null;
    this.rows = null;        // heatRows(): labels and the tensors of each row
    this.cols = null;        // per row, its norm per series row (a Derived)
    this.xs = [];
    this.blank = [];         // the uPlot series' y values: none (the draw hook paints the cells)
    this.bins = null;        // the columns of the last draw
    this.redraw = new Throttle(REDRAW_MS, () => this.push());
  }

  /** The series changed from row `from`; xs: the charts' x per row (steps or elapsed time). */
  update(xs, from) {
    this.xs = xs;
    if (!this.cols) {
      if (!this.asked) this.lookForNorms(from);
      return;
    }
    this.cols.update(this.series, from);
    this.redraw.request();
  }

  /** The first record with per-tensor norms: the run's layout, then the heatmap. */
  lookForNorms(from) {
    const recs = this.series.records;
    let found = false;
    for (let i = from; i < recs.length && !found; i++) found = hasTensorNorms(recs[i]);
    if (!found) return;
    this.asked = true;
    fetchJson(routePath('get_run_layout', { run_id: this.runId })).then((layout) => {
      this.params = layout.params;
      this.names = layout.params.map((p) => p.name);
      this.make();
    }).catch((e) => console.warn('no heatmap: the run\'s layout is unavailable', e));
  }

  make() {
    const card = $('heatmap-card');
    card.hidden = false;
    this.legend = legendBox($('heatmap-legend'));
    this.hoverBox = $('heatmap-hover');
    this.setRows($('heatmap-mode').value);
    this.chart = new Chart($('heatmap'), TITLES[this.rows.mode], [{ label: 'grad norm' }], {
      height: this.height(), x: $('xaxis').value, customize: (o) => this.customize(o) });
    this.chart.box.querySelector('h3').hidden = true;     // the card's heading says it
    $('heatmap-mode').addEventListener('change', () => this.setMode($('heatmap-mode').value));
    window.andreaHeatmap = this;     // tests read the rows, the columns and the plot
    this.redraw.request(true);
  }

  setRows(mode) {
    this.rows = heatRows(this.params, mode);
    this.cols = rowColumns(this.rows, this.names.length);
    this.cols.update(this.series, 0);
    $('heatmap-title').textContent = TITLES[mode][0].toUpperCase() + TITLES[mode].slice(1);
    $('heatmap-card').dataset.rows = String(this.rows.labels.length);
  }

  /** Rows per layer ('layer') or per tensor ('tensor'). */
  setMode(mode) {
    this.setRows(mode);
    this.chart.height = this.height();
    this.chart.rebuild();
    this.redraw.request(true);
  }

  height() {
    return this.rows.labels.length * ROW_PX[this.rows.mode] + 70;    // + the x axis
  }

  /** The columns to uPlot (the x scale, zoom and cursor are its), which then draws the cells. */
  push() {
    const n = this.xs.length;
    while (this.blank.length < n) this.blank.push(null);
    this.blank.length = n;
    this.chart.setData([this.xs, this.blank]);
  }

  /** The line chart's uPlot options made a heatmap's: a 'rows' scale (0 at the bottom, row 0
   *  at the top) that no other chart has, so a cursor synced from one moves only along x. */
  customize(o) {
    const { labels, mode } = this.rows;
    const R = labels.length;
    const small = mode === 'tensor';
    o.scales = { x: o.scales.x, rows: { auto: false, range: () => [0, R] } };
    o.series = [o.series[0], { label: 'grad norm', scale: 'rows', paths: () => null,
      points: { show: false } }];
    o.axes[1] = { scale: 'rows', label: mode, labelSize: 20, grid: { show: false },
      font: small ? '10px sans-serif' : '12px sans-serif',
      size: 24 + (small ? 6 : 7) * Math.max(...labels.map((l) => l.length)),
      splits: () => labels.map((_, r) => R - r - 0.5),
      values: (u, splits) => splits.map((s) => labels[Math.round(R - 0.5 - s)] ?? '') };
    o.legend = { show: false };
    o.cursor = { ...o.cursor, points: { show: false } };
    o.plugins = [];
    o.hooks = { ...o.hooks, draw: [(u) => this.drawCells(u)], setCursor: [(u) => this.hover(u)] };
    return o;
  }

  /** The cells of the shown x range, at most one column per CSS pixel, one fill per colour. */
  drawCells(u) {
    const xs = u.data[0];
    const { min, max } = u.scales.x;
    if (!xs.length || min === null || max === null) return;
    const { ctx, bbox } = u;
    const bins = binColumns(xs, this.cols.state.cols, min, max, Math.floor(bbox.width / uPlot.pxRatio));
    this.bins = bins;
    this.showLegend(bins);
    const rowH = bbox.height / this.rows.labels.length;
    const paths = new Map();      // colour -> Path2D of its cells
    const px = (x) => u.valToPos(x, 'x', true);
    for (let c = 0; c < bins.x0.length; c++) {
      const left = Math.floor(px(bins.x0[c]));
      const width = Math.max(1, Math.ceil(px(bins.x1[c])) - left);
      bins.vals.forEach((vals, r) => {
        const v = vals[c];
        if (Number.isNaN(v)) return;                     // no per-tensor norms at those steps
        const colour = v === null ? NONFINITE_COLOR : COLOURS[bucketOf(v, bins.min, bins.max)];
        if (!paths.has(colour)) paths.set(colour, new Path2D());
        paths.get(colour).rect(left, Math.floor(bbox.top + r * rowH), width, Math.ceil(rowH));
      });
    }
    ctx.save();
    ctx.beginPath();
    ctx.rect(bbox.left, bbox.top, bbox.width, bbox.height);
    ctx.clip();
    for (const [colour, path] of paths) {
      ctx.fillStyle = colour;
      ctx.fill(path);
    }
    ctx.restore();
  }

  showLegend(bins) {
    this.legend.min.textContent = bins.min === null ? '–' : fmtValue(bins.min);
    this.legend.max.textContent = bins.max === null ? '–' : fmtValue(bins.max);
  }

  /** The cell under the cursor in words: its row, its step(s) and its norm (per layer: the
   *  tensor that carried most of it). A cursor synced from another chart has no row: nothing. */
  hover(u) {
    const box = this.hoverBox;
    const { left, top } = u.cursor;
    const height = u.bbox.height / uPlot.pxRatio;
    const R = this.rows.labels.length;
    const c = this.bins && left >= 0 && top >= 0 && top < height
      ? columnAt(this.bins, u.posToVal(left, 'x')) : -1;
    if (c < 0) {
      box.textContent = '';
      delete box.dataset.row;
      return;
    }
    const r = Math.min(R - 1, Math.floor(top / (height / R)));
    const steps = this.series.steps;
    const v = this.bins.vals[r][c];
    const at = this.bins.at[r][c];
    const [a, b] = [this.bins.start[c], this.bins.end[c] - 1];
    let text = `${this.rows.names[r]}: ${b > a ? `steps ${steps[a]}–${steps[b]}` : `step ${steps[a]}`}`;
    if (Number.isNaN(v)) text += ', no per-tensor norms';
    else {
      text += `, ${b > a ? 'max ' : ''}grad norm ${v === null ? 'not finite' : fmtValue(v)}`;
      if (b > a) text += ` at step ${steps[at]}`;
    }
    const rec = this.series.records[at];
    const top1 = this.rows.members[r].length > 1 && hasTensorNorms(rec, this.names.length)
      ? topTensor(rec.tensor_grad_norms, this.rows.members[r]) : null;
    if (top1) {
      text += `; mostly ${shortName(this.names[top1.index])} (${fmtValue(top1.norm)}, ` +
        `${(top1.share * 100).toFixed(1)} % of the layer's squared norm)`;
    }
    box.textContent = text;
    box.dataset.row = this.rows.names[r];
    box.dataset.step = String(steps[at] ?? steps[a]);
    box.dataset.tensor = top1 ? this.names[top1.index] : this.names[this.rows.members[r][0]];
  }
}

/** The colour scale's legend: min, the palette, max, and the non-finite colour. */
function legendBox(box) {
  const span = (cls, text = '') => Object.assign(document.createElement('span'), { className: cls, textContent: text });
  const min = span('heat-min');
  const max = span('heat-max');
  const bar = span('heat-bar');
  bar.style.background = `linear-gradient(to right, ${PALETTE.join(', ')})`;
  const bad = span('heat-swatch');
  bad.style.background = NONFINITE_COLOR;
  box.replaceChildren('log scale: ', min, bar, max, ' ', bad, ' not finite');
  return { min, max };
}
