// The compare page's gradient norm per layer: a select of the layer ("embed", "layer i",
// "final norm", or the global norm: all layers together) and one line per run, in the compare
// charts' colours and dashes. A layer's norm comes from each record's tensor_grad_norms and
// the run's layout (heatmap_data.js); runs recorded without them are listed as such.
import { fetchJson } from './api.js';
import { Chart } from './charts.js';
import { hasTensorNorms, heatRows, layerValues } from './heatmap_data.js';
import { shownText } from './text.js';
import { routePath } from './facts.js';

export const TOTAL = 'all layers total';
const $ = (id) => document.getElementById(id);

export class LayerOverlay {
  /** spec: the compare charts' series (one per found run, same order); x: their x axis
   *  ('step', or 'tokens' with a room run among them). */
  constructor(spec, x = 'step') {
    this.params = new Map();    // run id -> its parameter table (runs with per-tensor norms)
    this.select = $('layer');
    this.chart = new Chart($('layer-charts'), 'grad norm of the layer', spec,
      { group: 'compare', y: 'L2 norm (before clipping)', positive: true, placeholder: 'No steps recorded.', x });
    this.select.append(new Option(TOTAL, TOTAL));
  }

  /** The layouts of the runs that have per-tensor norms now (each asked once). */
  async load(found) {
    await Promise.all(found.map(async (r) => {
      if (this.params.has(r.id) || !r.metrics.some((m) => hasTensorNorms(m))) return;
      try {
        const layout = await fetchJson(routePath('get_run_layout', { run_id: r.id }));
        this.params.set(r.id, layout.params);
      } catch (e) {
        console.warn(`no layout for run ${r.id}`, e);
      }
    }));
    // Every layer any run has, after the total: in model order, the deepest run's first.
    const lists = [...this.params.values()].map((params) => heatRows(params, 'layer').labels);
    const order = new Set(lists.sort((a, b) => b.length - a.length).flat());
    const have = new Set([...this.select.options].map((o) => o.value));
    for (const l of order) if (!have.has(l)) this.select.append(new Option(l, l));
    $('layers-card').hidden = false;
  }

  /** One column per run over `steps` (the charts' xs: a record's at x(run, record)) for the
   *  chosen layer; `smooth(col)` as the other charts. */
  draw(found, steps, smooth, x = (r, m) => m.step) {
    const layer = this.select.value;
    const missing = [];
    const cols = found.map((r) => {
      const params = this.params.get(r.id);
      let values;
      if (layer === TOTAL) values = r.metrics.map((m) => m.grad_norm ?? null);
      else if (!params) {
        missing.push(shownText(r.run.name));
        values = r.metrics.map(() => null);
      } else values = layerValues(r.metrics, params, layer);
      const by = new Map(r.metrics.map((m, i) => [x(r, m), values[i]]));
      return smooth(steps.map((s) => by.get(s) ?? null));
    });
    this.chart.setData([steps, ...cols]);
    this.chart.box.dataset.layer = layer;
    const note = $('layers-missing');
    note.textContent = missing.length ? `Without per-tensor norms (recorded before them): ${missing.join(', ')}` : '';
    note.dataset.missing = String(missing.length);
  }
}
