// The run page's prompt box: type a prompt, watch the model's continuation come token by token
// (temperature, top-k, length), each token's probability on hover. The model is the one that
// trains in this tab (asked between two steps: Trainer.ask), or else the run's newest weights
// (the final ones, or its newest checkpoint's) loaded into this browser's GPU.
import { createContext } from '../engine/context.js';
import { Model } from '../engine/model.js';
import { generateTokens } from '../engine/sampler.js';
import { fetchLoader } from '../engine/shaders.js';
import { fetchJson, jsonBody, responseDetail } from './api.js';
import { SHADER_BASE } from './assets.js';
import { routePath } from './facts.js';
import { flatWeights } from './safetensors.js';
import { taskFacts, tokenizerKey } from './task_facts.js';
import { utf8Decoder } from './text.js';

const $ = (id) => document.getElementById(id);

/** Binds the prompt box to the run page's state (its config, run, trainer). */
export function bindPromptBox(state) {
  const box = { ctx: null, model: null, url: null, table: null };
  $('prompt-form').addEventListener('submit', (e) => {
    e.preventDefault();
    answer(state, box).catch((err) => {
      $('prompt-status').textContent = `Could not answer: ${err.message}`;
      document.body.dataset.prompt = 'failed';
    }).finally(() => { $('prompt-go').disabled = false; });
  });
}

/** The box's defaults for the run: a toy task's prompt is one of its problems, answered greedily
 *  with as many tokens as its answers have. */
export async function promptDefaults(config) {
  $('prompt-card').hidden = false;
  const task = await taskFacts(config);
  if (!task) return;
  $('prompt').value = task.example.slice(0, task.answer_start);
  $('prompt-temperature').value = '0';
  $('prompt-length').value = String(task.answer_len);
}

async function answer(state, box) {
  $('prompt-go').disabled = true;
  document.body.dataset.prompt = 'busy';
  const { config, runId } = state;
  const n = Number($('prompt-length').value);
  const opts = { temperature: Number($('prompt-temperature').value),
    topK: Number($('prompt-top-k').value), seed: Date.now() % 2 ** 31 };
  const key = tokenizerKey(config);
  box.table ??= await fetchJson(routePath('tokenizer', { key }));
  const res = await fetch(routePath('encode_text', { key }), jsonBody('POST', { text: $('prompt').value }));
  if (!res.ok) throw new Error(await responseDetail(res));
  const { ids } = await res.json();
  if (!ids.length) throw new Error('type a prompt first');
  const out = $('prompt-out');
  const decode = utf8Decoder(box.table);
  out.replaceChildren(Object.assign(document.createElement('span'),
    { className: 'sample-prompt', textContent: decode(ids) }));
  const shown = [];
  const onToken = (t) => {
    const span = Object.assign(document.createElement('span'), { className: 'prompt-token',
      textContent: decode([t.id]), title: `p = ${t.p.toPrecision(3)} (token ${t.id})` });
    span.dataset.p = String(t.p);
    out.append(span);
    shown.push(t);
  };
  const trainer = state.trainer;
  const live = trainer && ['running', 'pausing', 'paused'].includes(trainer.state);
  if (live) {
    $('prompt-status').textContent = `the model training in this tab, after step ${trainer.done}`;
    await trainer.ask((model) => generateTokens(model, ids, n, { ...opts, onToken }));
  } else {
    const model = await viewerModel(state, box);
    await generateTokens(model, ids, n, { ...opts, onToken });
  }
  document.body.dataset.prompt = 'done';
  return shown;
}

/** The run's newest weights in a model of this browser's own (made once per weights). */
async function viewerModel(state, box) {
  const { runId } = state;
  const run = await fetchJson(routePath('get_run', { run_id: runId }));   // its newest weights
  const step = run?.has_weights ? null : run?.checkpoint?.last_step;
  if (!run?.has_weights && !step) throw new Error('this run has no weights yet: no checkpoint and no final weights');
  const url = routePath('get_model', { run_id: runId }) + (step ? `?step=${step}` : '');
  $('prompt-status').textContent = step ? `the weights of its newest checkpoint, after step ${step}`
    : 'its final weights';
  if (box.url === url) return box.model;
  box.model?.destroy();
  box.model = null;
  box.ctx ??= await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE) });
  const [layout, body] = await Promise.all([
    fetchJson(routePath('get_run_layout', { run_id: runId })),
    fetch(url).then(async (r) => {
      if (!r.ok) throw new Error(await responseDetail(r));
      return r.arrayBuffer();
    })]);
  const model = new Model(box.ctx, layout);
  model.setParams(flatWeights(body, layout));
  box.model = model;
  box.url = url;
  return model;
}
