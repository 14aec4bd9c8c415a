// Live charts with uPlot: columnar data (the run page keeps it in series.js), one setData per
// animation frame. Ticks and hover values fit the value's scale (scientific where needed), axes
// have titles with units, a log scale that keeps to the data's range, charts resize with their
// box, and the charts of one group share their cursor and their zoom (uPlot cursor.sync, plus
// the x scale). A placeholder says why a chart is still empty.
import uPlot from 'uplot';   // templates/base.html's import map
import { durationTicks, fmtDuration, fmtValue, tickLabels } from './format.js';
import { isolatedPoints } from './series.js';

export { fmtBytes, fmtCount, fmtDuration, fmtValue } from './format.js';

export const COLORS = ['#2a6df4', '#e8710a', '#0a7d38', '#b3261e', '#8e44ad', '#00838f',
  '#c2185b', '#5d4037'];
export const DASHES = [undefined, [8, 4], [2, 3], [10, 3, 2, 3]];

/** fn run at most every `ms` for live data: a request within `ms` of the last run waits for
 *  the rest (requests meanwhile coalesce into that one); request(true) runs it now (what the
 *  user changed). */
export class Throttle {
  constructor(ms, fn) {
    this.ms = ms;
    this.fn = fn;
    this.last = -Infinity;   // performance.now() of the last run
    this.timer = null;       // the pending wait, if any
  }

  request(now = false) {
    const wait = now ? 0 : this.last + this.ms - performance.now();
    if (wait > 0) this.timer ??= setTimeout(() => this.run(), wait);
    else this.run();
  }

  run() {
    clearTimeout(this.timer);
    this.timer = null;
    this.last = performance.now();
    this.fn();
  }
}

// ---- scales -----------------------------------------------------------------------------

/** ~n round values from min to max (steps of 1, 2, 2.5 or 5 times a power of ten). */
function niceSplits(min, max, n = 5) {
  const raw = (max - min) / n;
  if (!(raw > 0)) return [min];
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

/** Log-axis ticks: 1, 2, 5 times powers of ten inside the range; a narrow range (within a
 *  decade or so) gets round linear ticks instead of one lonely label. */
function logSplits(u, axisIdx, min, max) {
  const out = [];
  for (let e = Math.floor(Math.log10(min)); e <= Math.ceil(Math.log10(max)); e++) {
    for (const m of [1, 2, 5]) {
      const v = Number((m * 10 ** e).toPrecision(6));
      if (v >= min && v <= max) out.push(v);
    }
  }
  return out.length >= 3 ? out : niceSplits(min, max, 4);
}

/** A log range that hugs the data (uPlot's default stretches it to whole decades). */
function logRange(u, min, max) {
  if (!(min > 0) || !(max > 0)) return [1, 10];
  if (max / min - 1 <= 1e-9) return [min / 1.5, max * 1.5];
  const pad = (max / min) ** 0.06;
  return [min / pad, max * pad];
}

/** A linear range with a little room, and a visible span for a constant series. */
function linRange(u, min, max) {
  if (min === null || max === null) return [0, 1];
  // Equal up to rounding (a smoothed constant): drawn as the constant it is.
  if (max - min <= 1e-9 * Math.max(Math.abs(min), Math.abs(max))) {
    min = max;
    const d = Math.abs(min) * 0.1 || 1;
    return [min - d, max + d];
  }
  const pad = (max - min) * 0.06;
  return [min - pad, max + pad];
}

// ---- plugins ----------------------------------------------------------------------------

/** Vertical marks at given x values (phase changes, resumes), drawn under the series. */
function marksPlugin(getMarks, color) {
  return {
    hooks: {
      drawAxes: [(u) => {
        const { ctx, bbox } = u;
        ctx.save();
        ctx.strokeStyle = color;
        ctx.setLineDash([4, 4]);
        for (const x of getMarks()) {
          const px = Math.round(u.valToPos(x, 'x', true));
          if (px < bbox.left || px > bbox.left + bbox.width) continue;
          ctx.beginPath();
          ctx.moveTo(px, bbox.top);
          ctx.lineTo(px, bbox.top + bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

// Whole steps only on a step axis (1, 2, 5, 10, 20, 25, 50, ...).
const STEP_INCRS = [];
for (let m = 1; m <= 1e9; m *= 10) STEP_INCRS.push(m, 2 * m, ...(m >= 10 ? [2.5 * m] : []), 5 * m);

// Charts of one group (a page's): shared cursor (uPlot's sync) and shared x zoom.
const groups = new Map();
function groupOf(key) {
  if (!groups.has(key)) groups.set(key, { charts: new Set(), zoom: null });
  return groups.get(key);
}

/**
 * A chart of `series` ([{label, color?, points?, dash?, width?}]) over x. setData(cols) sets
 * columnar data [xs, ys1, ...]; update(cols) does it on the next frame (coalesced).
 * Options: y (axis title with unit), x ('step' | 'time': elapsed seconds), log (start on a log
 * scale), positive (the values are > 0, so a log scale makes sense), marks (() => xs),
 * group (cursor and zoom shared with the group's other charts), placeholder (shown while
 * there is no data), height, customize ((uPlot options) => options: a chart that draws its own
 * way, such as the heatmap, keeps the group's zoom and cursor).
 */
export class Chart {
  constructor(parent, title, series, {
    log = false, marks = () => [], height = 220, y = '', x = 'step', positive = false,
    group = 'page', placeholder = 'No data yet.', zeroLine = false, customize = (o) => o,
  } = {}) {
    const box = document.createElement('div');
    box.className = 'chart';
    box.dataset.chart = title;
    const h = document.createElement('h3');
    h.textContent = title;
    const empty = document.createElement('div');
    empty.className = 'chart-empty';
    empty.textContent = placeholder;
    box.append(h, empty);
    parent.append(box);
    Object.assign(this, { box, empty, title, height, positive, xMode: x, yTitle: y, marks, customize });
    this.group = groupOf(group);
    this.group.charts.add(this);
    this.groupKey = group;
    this.seriesSpec = series;
    this.log = log && positive;
    this.zeroLine = zeroLine;
    this.syncing = false;
    this.raw = [[], ...series.map(() => [])];
    this.plot = this.make(this.raw);
    this.resizer = new ResizeObserver(() => this.fit());
    this.resizer.observe(box);
  }

  width() {
    return Math.max(200, Math.floor(this.box.clientWidth || this.box.parentElement.clientWidth || 400));
  }

  opts() {
    return this.customize(this.lineOpts());
  }

  lineOpts() {
    const xTime = this.xMode === 'time';
    const xName = this.xMode === 'step' ? 'step' : this.xMode;   // e.g. a room's 'global version'
    const fmtX = xTime ? (v) => fmtDuration(v) : (v) => (v === null ? '–' : String(Math.round(v)));
    return {
      width: this.width(), height: this.height,
      scales: {
        x: { time: false },
        y: this.log ? { distr: 3, log: 10, range: logRange } : { distr: 1, range: linRange },
      },
      series: [{ label: xTime ? 'elapsed' : xName, value: (u, v) => fmtX(v) },
        ...this.seriesSpec.map((s, i) => {
          const color = s.color || COLORS[i % COLORS.length];
          return {
            label: s.label, stroke: color, width: s.width ?? 1.5, dash: s.dash, spanGaps: true,
            value: (u, v) => fmtValue(v),
            // A line draws nothing for a lone value (one eval per run, the first step): those
            // get a marker (uPlot draws the filter's indices even with show false).
            points: s.points ? { show: true, size: 6, fill: color }
              : { show: false, size: 6, fill: color,
                filter: (u, si) => isolatedPoints(u.data[si], true) },
            paths: s.points ? () => null : undefined,
          };
        })],
      cursor: { sync: { key: this.groupKey, setSeries: false }, drag: { x: true, y: false } },
      legend: { live: true },
      plugins: [marksPlugin(this.marks, '#c9a0dc')],
      axes: [
        { label: xTime ? 'elapsed (wall clock)' : xName, labelSize: 20, size: 32,
          ...(xTime ? {} : { incrs: STEP_INCRS }),
          values: (u, splits) => (xTime ? durationTicks(splits) : tickLabels(splits)) },
        { label: this.yTitle, labelSize: 20,
          // As wide as the longest tick label (uPlot measures again when the labels change).
          size: (u, values) => 18 + 7 * Math.max(3, ...(values ?? []).map((v) => String(v ?? '').length)),
          values: (u, splits) => tickLabels(splits),
          ...(this.log ? { splits: logSplits, filter: (u, splits) => splits } : {}) },
      ],
      hooks: {
        setScale: [(u, key) => { if (key === 'x') this.zoomed(u); }],
        ...(this.zeroLine ? { drawAxes: [(u) => this.drawZero(u)] } : {}),
      },
    };
  }

  make(data) {
    const plot = new uPlot(this.opts(), this.clean(data), this.box);
    return plot;
  }

  /** On a log scale, values <= 0 cannot be drawn: gaps. */
  clean(cols) {
    if (!this.log) return cols;
    return cols.map((c, i) => (i === 0 ? c : c.map((v) => (v !== null && v > 0 ? v : null))));
  }

  drawZero(u) {
    const y = u.valToPos(0, 'y', true);
    const { ctx, bbox } = u;
    if (y < bbox.top || y > bbox.top + bbox.height) return;
    ctx.save();
    ctx.strokeStyle = '#888';
    ctx.beginPath();
    ctx.moveTo(bbox.left, y);
    ctx.lineTo(bbox.left + bbox.width, y);
    ctx.stroke();
    ctx.restore();
  }

  /** The x scale changed on this chart: a user's zoom (or its reset) goes to the group. */
  zoomed(u) {
    if (this.syncing) return;
    const xs = u.data[0];
    const { min, max } = u.scales.x;
    const full = !xs.length || (min <= xs[0] && max >= xs[xs.length - 1]);
    if (full && !this.group.zoom) return;     // nothing was zoomed: nothing to share
    this.group.zoom = full ? null : { min, max };
    for (const other of this.group.charts) if (other !== this) other.applyZoom();
  }

  applyZoom() {
    const xs = this.plot.data[0];
    if (xs.length < 2) return;
    const z = this.group.zoom;
    const { min, max } = this.plot.scales.x;
    if (!z && min <= xs[0] && max >= xs[xs.length - 1]) return;    // not zoomed here either
    if (z && !(z.max > z.min)) return;
    this.syncing = true;
    this.plot.setScale('x', z ?? { min: xs[0], max: xs[xs.length - 1] });
    this.syncing = false;
  }

  fit() {
    const w = this.width();
    if (w !== this.plot.width) this.plot.setSize({ width: w, height: this.height });
  }

  /** Columns [xs, ys1, ...] now (the run page calls it once per animation frame). */
  setData(cols) {
    this.raw = cols;
    this.syncing = true;
    this.plot.setData(this.clean(cols));
    this.syncing = false;
    if (this.group.zoom) this.applyZoom();
    const n = cols[0].length;
    this.box.dataset.points = String(n);
    this.empty.hidden = n > 0;
  }

  /** setData on the next animation frame, coalescing calls in between. */
  update(cols) {
    this.pending = cols;
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      this.setData(this.pending);
    });
  }

  setPlaceholder(text) {
    this.empty.textContent = text;
  }

  /** Log or linear y (only for charts of positive values); rebuilds the plot. */
  setLog(log) {
    log = log && this.positive;
    if (log === this.log) return;
    this.log = log;
    this.rebuild();
  }

  /** x as 'step' or 'time' (elapsed seconds): the caller gives the matching xs next. */
  setX(mode) {
    if (mode === this.xMode) return;
    this.xMode = mode;
    this.group.zoom = null;
    this.rebuild();
  }

  rebuild() {
    this.plot.destroy();
    this.plot = this.make(this.raw);
    this.box.dataset.log = String(this.log);
  }

  destroy() {
    this.resizer.disconnect();
    this.group.charts.delete(this);
    this.plot.destroy();
    this.box.remove();
  }
}
