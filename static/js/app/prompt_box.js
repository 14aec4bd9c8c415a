// The run page's prompt box: type a prompt, watch the model's continuation come token by token
// (temperature, top-k, length), each token's probability on hover. The model is the one that
// trains in this tab, or else the run's newest weights (model_source.js).
import { generateTokens } from '../engine/sampler.js';
import { fetchJson, jsonBody, responseDetail } from './api.js';
import { routePath } from './facts.js';
import { taskFacts, tokenizerKey } from './task_facts.js';
import { utf8Decoder } from './text.js';

const $ = (id) => document.getElementById(id);

/** Binds the prompt box to the run page's state (its config) and a ModelSource. */
export function bindPromptBox(state, source) {
  const box = { table: null };
  $('prompt-form').addEventListener('submit', (e) => {
    e.preventDefault();
    answer(state, source, box).catch((err) => {
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

/** A text's token ids under the run's tokenizer (the server's: the page has its decode table
 *  only). */
export async function encodeText(config, text) {
  const res = await fetch(routePath('encode_text', { key: tokenizerKey(config) }),
    jsonBody('POST', { text }));
  if (!res.ok) throw new Error(await responseDetail(res));
  return (await res.json()).ids;
}

async function answer(state, source, box) {
  $('prompt-go').disabled = true;
  document.body.dataset.prompt = 'busy';
  const { config } = state;
  const n = Number($('prompt-length').value);
  const opts = { temperature: Number($('prompt-temperature').value),
    topK: Number($('prompt-top-k').value), seed: Date.now() % 2 ** 31 };
  box.table ??= await fetchJson(routePath('tokenizer', { key: tokenizerKey(config) }));
  const ids = await encodeText(config, $('prompt').value);
  if (!ids.length) throw new Error('type a prompt first');
  const out = $('prompt-out');
  const decode = utf8Decoder(box.table);
  out.replaceChildren(Object.assign(document.createElement('span'),
    { className: 'sample-prompt', textContent: decode(ids) }));
  const onToken = (t) => {
    const span = Object.assign(document.createElement('span'), { className: 'prompt-token',
      textContent: decode([t.id]), title: `p = ${t.p.toPrecision(3)} (token ${t.id})` });
    span.dataset.p = String(t.p);
    out.append(span);
  };
  $('prompt-status').textContent = source.live() ? 'the model training in this tab' : 'the run\'s newest weights';
  const { label } = await source.use('auto', (model) => generateTokens(model, ids, n, { ...opts, onToken }));
  $('prompt-status').textContent = label;
  document.body.dataset.prompt = 'done';
}
