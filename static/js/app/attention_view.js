// The run page's attention maps: for a text the user types (a toy task's problem, or the
// prompt box's text), every layer's and head's attention probabilities as a grid, the text's
// tokens on both axes (rows: the query; columns: the key it reads), darker for more. From the
// model training in this tab, refreshed every few steps while the view is open (a forward of
// one short sequence between two steps: closed, it costs the training nothing), or from any
// checkpoint of the run, picked in the list (model_source.js).
import { fetchJson } from './api.js';
import { routePath } from './facts.js';
import { encodeText } from './prompt_box.js';
import { tokenizerKey } from './task_facts.js';
import { utf8Decoder } from './text.js';

const $ = (id) => document.getElementById(id);
const MAX_TOKENS = 64;        // a grid of 64 x 64 cells per head at most
const REFRESH_MS = 2000;      // live: a new map at most this often

/** Binds the attention card to the run page's state and a ModelSource. */
export function bindAttention(state, source) {
  // ticket: the newest draw's number. A draw still running when a newer one starts (the live
  // refresh the moment training ends, then the user's click) must not overwrite its maps.
  const view = { table: null, timer: null, shown: 0, ticket: 0 };
  const card = $('attention-card');
  card.hidden = false;
  const draw = () => {
    const ticket = ++view.ticket;
    return show(state, source, view, ticket).catch((err) => {
      if (ticket !== view.ticket) return;
      $('attention-status').textContent = `Could not draw: ${err.message}`;
      document.body.dataset.attention = 'failed';
    });
  };
  $('attention-form').addEventListener('submit', (e) => { e.preventDefault(); draw(); });
  $('attention-weights').addEventListener('focus', () => fillChoices(source));
  // Live: while the view is open and this tab trains, a new map every REFRESH_MS.
  $('attention-details').addEventListener('toggle', () => {
    clearInterval(view.timer);
    view.timer = null;
    if (!$('attention-details').open) return;
    fillChoices(source);
    view.timer = setInterval(() => {
      if (source.live() && $('attention-weights').value === 'auto' && view.shown && !view.busy) draw();
    }, REFRESH_MS);
  });
}

async function fillChoices(source) {
  const select = $('attention-weights');
  const keep = select.value;
  const choices = await source.choices();
  select.replaceChildren(...choices.map((c) => new Option(c.label, c.value)));
  if (choices.some((c) => c.value === keep)) select.value = keep;
}

async function show(state, source, view, ticket) {
  view.busy = true;
  document.body.dataset.attention = 'busy';
  try {
    const { config } = state;
    view.table ??= await fetchJson(routePath('tokenizer', { key: tokenizerKey(config) }));
    const text = $('attention-text').value || $('prompt').value;
    const ids = (await encodeText(config, text)).slice(0, MAX_TOKENS);
    if (!ids.length) throw new Error('type a text first');
    const n = ids.length;
    const { result, label } = await source.use($('attention-weights').value || 'auto', async (model) => {
      // A window of a multiple of 16 tokens, padded after the text: causal attention keeps the
      // text's rows as they are, and few plans are made.
      const W = Math.min(model.config.seq_len, Math.ceil(n / 16) * 16);
      const plan = await model.plan(1, W);
      const buf = new Uint32Array(W);
      buf.set(ids.slice(0, W));
      model.writeBatch(plan, buf);
      model.submit(plan.forward);
      return { W, probs: await model.attentionProbs(plan), L: model.config.n_layer,
        H: model.config.n_head };
    });
    if (ticket !== view.ticket) return;   // a newer draw shows its own
    const decode = utf8Decoder(view.table);
    const labels = ids.map((id) => shownToken(decode([id])));
    drawMaps($('attention-maps'), result, Math.min(n, result.W), labels);
    $('attention-status').textContent = label;
    view.shown++;
    document.body.dataset.attention = 'done';
  } finally {
    if (ticket === view.ticket) view.busy = false;
  }
}

/** A token as an axis label: whitespace visible. */
function shownToken(s) {
  return s.replace(/\n/g, '⏎').replace(/ /g, '·').replace(/\t/g, '⇥') || '∅';
}

/** One table per (layer, head): rows the queries, columns the keys, the tokens on both axes;
 *  each cell's shade its probability (hover: the pair and the number). */
function drawMaps(root, { W, probs, L, H }, n, labels) {
  const maps = [];
  for (let l = 0; l < L; l++) {
    for (let h = 0; h < H; h++) {
      const fig = document.createElement('figure');
      fig.className = 'attention-map';
      fig.dataset.layer = String(l);
      fig.dataset.head = String(h);
      const cap = document.createElement('figcaption');
      cap.textContent = `layer ${l} head ${h}`;
      const table = document.createElement('table');
      const head = table.createTHead().insertRow();
      head.insertCell().className = 'corner';
      for (const t of labels) Object.assign(head.insertCell(), { textContent: t, className: 'key' });
      const body = table.createTBody();
      const base = (l * H + h) * W * W;
      for (let i = 0; i < n; i++) {
        const row = body.insertRow();
        Object.assign(row.insertCell(), { textContent: labels[i], className: 'query' });
        for (let j = 0; j < n; j++) {
          const p = j <= i ? probs[base + i * W + j] : 0;
          const cell = row.insertCell();
          cell.style.background = `rgba(11, 61, 145, ${p.toFixed(3)})`;
          cell.title = `${labels[i]} → ${labels[j]}: ${p.toFixed(3)}`;
        }
      }
      fig.append(cap, table);
      maps.push(fig);
    }
  }
  root.replaceChildren(...maps);
  root.dataset.tokens = JSON.stringify(labels);
}
