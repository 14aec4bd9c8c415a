// Live charts with uPlot: columnar data (the run page keeps it in series.js), one setData per
// animation frame, clip events and bandit phase changes marked, a log scale for the loss.
import uPlot from 'uplot';   // templates/base.html's import map

const COLORS = ['#2a6df4', '#e8710a', '#0a7d38', '#b3261e', '#8e44ad', '#00838f'];

/** Exponential moving average with bias correction (TensorBoard-style), nulls kept as gaps. */
export function smooth(ys, alpha) {
  if (!alpha) return ys;
  let m = 0;
  let n = 0;
  return ys.map((y) => {
    if (y === null || !Number.isFinite(y)) return null;
    m = alpha * m + (1 - alpha) * y;
    n += 1;
    return m / (1 - alpha ** n);
  });
}

/** Vertical marks at given x values (phase changes), drawn under the series. */
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

/**
 * A chart of `series` ([{label, color?, points?, dash?}]) over x = step. setData(cols) sets
 * columnar data [xs, ys1, ...]; update(cols) does it on the next frame (coalesced).
 */
export class Chart {
  constructor(parent, title, series, { log = false, marks = () => [], height = 220 } = {}) {
    const box = document.createElement('div');
    box.className = 'chart';
    box.dataset.chart = title;
    const h = document.createElement('h3');
    h.textContent = title;
    box.append(h);
    parent.append(box);
    this.box = box;
    this.opts = {
      width: Math.max(320, parent.clientWidth / 2 - 40), height,
      scales: { x: { time: false }, y: { distr: log ? 3 : 1 } },
      series: [{ label: 'step' }, ...series.map((s, i) => ({
        label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: 1.5,
        dash: s.dash, spanGaps: true,
        points: s.points ? { show: true, size: 6, fill: s.color || COLORS[i % COLORS.length] }
          : { show: false },
        paths: s.points ? () => null : undefined,
      }))],
      plugins: [marksPlugin(marks, '#c9a0dc')],
      axes: [{}, { size: 60 }],
    };
    this.plot = new uPlot(this.opts, [[], ...series.map(() => [])], box);
    this.pending = null;
  }

  /** Columns [xs, ys1, ...] now (the run page calls it once per animation frame). */
  setData(cols) {
    this.plot.setData(cols);
    this.box.dataset.points = String(cols[0].length);
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

  setLog(log) {
    if (this.plot.scales.y.distr === (log ? 3 : 1)) return;
    const data = this.plot.data;
    this.opts.scales.y.distr = log ? 3 : 1;
    this.plot.destroy();
    this.plot = new uPlot(this.opts, data, this.box);
  }
}
