// The model a page's views ask (the prompt box, the attention maps): the one training in this
// tab, asked between two steps (Trainer.ask), or weights the server holds (the run's final
// ones, or a checkpoint's) loaded into this browser's own GPU, one set at a time.
import { createContext } from '../engine/context.js';
import { Model } from '../engine/model.js';
import { fetchLoader } from '../engine/shaders.js';
import { fetchJson, responseDetail } from './api.js';
import { SHADER_BASE } from './assets.js';
import { routePath } from './facts.js';
import { flatWeights } from './safetensors.js';

export class ModelSource {
  /** state: the run page's (runId; trainer while this tab trains the run). */
  constructor(state) {
    this.state = state;
    this.ctx = null;
    this.model = null;     // the loaded weights' model, and which they are
    this.url = null;
    this.busy = Promise.resolve();
  }

  /** Whether the run trains in this tab now (its model can be asked live). */
  live() {
    const t = this.state.trainer;
    return Boolean(t) && ['running', 'pausing', 'paused'].includes(t.state);
  }

  /** The weights a view may pick: [{value, label}], newest first: 'auto' (the live model here,
   *  else the newest weights), the final weights, each checkpoint. */
  async choices() {
    const { runId } = this.state;
    const [run, ckpts] = await Promise.all([
      fetchJson(routePath('get_run', { run_id: runId })),
      fetchJson(routePath('list_checkpoints', { run_id: runId })).catch(() => []),
    ]);
    const out = [{ value: 'auto', label: this.live() ? 'live (training in this tab)' : 'newest' }];
    if (run.has_weights) out.push({ value: 'final', label: 'final weights' });
    for (const c of [...ckpts].sort((a, b) => b.step - a.step)) {
      out.push({ value: String(c.step), label: `checkpoint after step ${c.step}` });
    }
    return out;
  }

  /** fn(model) on the chosen weights ('auto', 'final' or a checkpoint's step, as choices()
   *  gives them), one call at a time; -> {result, label: which model answered, in words}. */
  use(which, fn) {
    const turn = this.busy.then(() => this.run(which, fn));
    this.busy = turn.catch(() => {});
    return turn;
  }

  async run(which, fn) {
    if (which === 'auto' && this.live()) {
      const t = this.state.trainer;
      const label = `the model training in this tab, after step ${t.done}`;
      return { result: await t.ask(fn), label };
    }
    const { runId } = this.state;
    let step = null;
    if (which === 'auto') {
      const run = await fetchJson(routePath('get_run', { run_id: runId }));   // its newest
      if (!run.has_weights) {
        step = run.checkpoint?.last_step;
        if (!step) throw new Error('this run has no weights yet: no checkpoint and no final weights');
      }
    } else if (which !== 'final') {
      step = Number(which);
    }
    const label = step ? `the weights of its checkpoint after step ${step}` : 'its final weights';
    const url = routePath('get_model', { run_id: runId }) + (step ? `?step=${step}` : '');
    if (this.url !== url) await this.load(url);
    return { result: await fn(this.model), label };
  }

  async load(url) {
    this.model?.destroy();
    this.model = null;
    this.url = null;
    this.ctx ??= await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE) });
    const [layout, body] = await Promise.all([
      fetchJson(routePath('get_run_layout', { run_id: this.state.runId })),
      fetch(url).then(async (r) => {
        if (!r.ok) throw new Error(await responseDetail(r));
        return r.arrayBuffer();
      })]);
    const model = new Model(this.ctx, layout);
    model.setParams(flatWeights(body, layout));
    this.model = model;
    this.url = url;
  }
}
