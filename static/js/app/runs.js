// Runs list: name, tags, status, progress, model, corpus, losses, time; sort and filter; rename
// (in place) and delete; pick runs to compare. It polls the API every few seconds, so it follows
// runs as they change.
import { jsonBody, responseDetail, withToken } from './api.js';
import { fmtDuration } from './format.js';
import { roomProgress, roomStatus } from './room_words.js';
import { statusLabel } from './run_status.js';
import { setShown, shownText } from './text.js';
import { routePath } from './facts.js';

const POLL_MS = 3000;
const tbody = document.querySelector('#runs tbody');
const button = document.getElementById('compare');
const filter = document.getElementById('filter');
const statusFilter = document.getElementById('status-filter');
const older = document.getElementById('older');
const state = {
  runs: [],                 // GET /api/runs, as last read (its first `pages` pages)
  lastText: null,           // its text: an unchanged answer leaves the rows alone
  pages: 1,                 // pages shown: "Show older runs" adds one
  total: null,              // runs stored (X-Total-Count)
  selected: new Set(),      // ids ticked for Compare
  sort: { key: 'created_at', dir: -1 },
  renaming: null,           // {id, form, input, why}: a row's inline rename, kept across renders
};

function cell(tr, content, cls) {
  const td = tr.insertCell();
  if (content instanceof Node) td.append(content);
  else td.textContent = content;
  if (cls) td.className = cls;
  return td;
}

function link(href, text) {
  const a = document.createElement('a');
  a.href = href;
  a.textContent = text;
  return a;
}

const fmtLoss = (v) => (v === null || v === undefined ? '–' : v.toFixed(4));
// (a room's: from its first join to its last round's close)
const elapsedOf = (r) => (r.room ? r.room.elapsed_s ?? null
  : r.first_time && r.last_time ? r.last_time - r.first_time : null);
// A room run (r.room: the server's line of it) counts rounds closed, and its losses are the
// global eval losses of its versions (no one tab's training loss is the run's).
const progressOf = (r) => (r.room ? r.room.version / r.room.rounds : (r.last_step ?? 0) / r.config.steps);
const lastLossOf = (r) => (r.room ? r.room.eval_loss : r.last_loss);
const bestEvalOf = (r) => (r.room ? r.room.best_eval_loss : r.best_eval_loss);
/** The state a run is filtered and sorted by: a room run's is its room's (it has no one
 *  training tab: "no training tab" would say nothing). */
const labelOf = (r) => (r.room ? (r.room.finished ? 'finished' : 'running') : statusLabel(r));
// The text a run trained on, as its user picked it: its sources' names, or "all" (left out:
// every source of the server's corpus). The corpus hash tells corpora of the same names apart.
const sourcesOf = (r) => (r.config.sources?.length ? r.config.sources.join(', ') : 'all');
const corpusOf = (r) => r.config.corpus_hash;

/** The sort key of a run (nulls last whichever the direction). */
function keyOf(r, key) {
  if (key === 'progress') return progressOf(r);
  if (key === 'elapsed') return elapsedOf(r);
  if (key === 'preset') return `${r.model_name} ${r.config.optimizer}`;
  if (key === 'name') return r.name.toLowerCase();
  if (key === 'status') return labelOf(r);
  if (key === 'last_loss') return lastLossOf(r);
  if (key === 'best_eval_loss') return bestEvalOf(r);
  if (key === 'corpus') return `${sourcesOf(r)} ${corpusOf(r)}`;
  return r[key] ?? null;
}

function matches(r) {
  if (statusFilter.value && labelOf(r) !== statusFilter.value) return false;
  const q = filter.value.trim().toLowerCase();
  if (!q) return true;
  const hay = [r.name, r.id, labelOf(r), r.room ? 'room' : '', r.model_name, r.config.optimizer, ...(r.tags || []),
    r.notes || '', sourcesOf(r), corpusOf(r)].join(' ').toLowerCase();
  return q.split(/\s+/).every((w) => hay.includes(w));
}

/** A run's corpus cell: its sources, and where the list holds runs of more than one corpus, a
 *  short hash of that corpus (the title has it whole: the server's text when the run was made). */
function corpusCell(r, severalCorpora) {
  const span = document.createElement('span');
  span.append(setShown(document.createElement('span'), sourcesOf(r)));
  if (severalCorpora) {
    span.append(' ', Object.assign(document.createElement('small'),
      { className: 'muted', textContent: corpusOf(r).slice(0, 8) }));
  }
  span.title = `corpus ${corpusOf(r)}: ${shownText(sourcesOf(r))}`;
  return span;
}

function render() {
  // The inline rename survives the rows being made anew (a poll, a sort): its element moves to
  // the new row, and gets its focus and selection back.
  const editing = state.renaming?.form.contains(document.activeElement) ? document.activeElement : null;
  const selection = editing === state.renaming?.input
    ? [editing.selectionStart, editing.selectionEnd, editing.selectionDirection] : null;
  const severalCorpora = new Set(state.runs.map(corpusOf)).size > 1;
  const shown = state.runs.filter(matches).sort((a, b) => {
    const x = keyOf(a, state.sort.key);
    const y = keyOf(b, state.sort.key);
    if (x === y) return 0;
    if (x === null) return 1;
    if (y === null) return -1;
    return (x < y ? -1 : 1) * state.sort.dir;
  });
  tbody.replaceChildren();
  for (const r of shown) {
    const tr = tbody.insertRow();
    tr.dataset.runId = r.id;
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.value = r.id;
    box.checked = state.selected.has(r.id);
    box.setAttribute('aria-label', `select ${shownText(r.name)}`);
    cell(tr, box);
    const name = document.createElement('span');
    name.append(setShown(link(routePath('run_page', { run_id: r.id }), ''), r.name));
    const sub = document.createElement('small');
    sub.className = 'muted';
    sub.textContent = ` ${r.id}`;
    name.append(sub);
    for (const t of r.tags || []) {
      name.append(' ', setShown(Object.assign(document.createElement('span'), { className: 'tag' }), t));
    }
    cell(tr, state.renaming?.id === r.id ? state.renaming.form : name, 'name');
    const ck = r.checkpoint?.last_step;
    // What is true now: "never started", "no training tab" (run_status.js), not a stale status.
    const label = labelOf(r);
    const st = cell(tr, r.room ? roomStatus(r.room)
      : label + (r.can_resume ? ` · resumable from step ${ck}` : ''), 'status');
    st.dataset.status = label;
    st.title = r.message ?? '';       // why it failed, stopped, was interrupted or never started
    cell(tr, r.room ? roomProgress(r.room)
      : `${r.last_step ?? 0} / ${r.config.steps} (${Math.floor(progressOf(r) * 100)} %)`, 'progress');
    cell(tr, `${r.model_name} · ${r.config.optimizer}${r.config.f16_mirror ? ' + f16' : ''}` +
      (r.room ? ' · room' : ''));
    cell(tr, corpusCell(r, severalCorpora), 'corpus');
    const last = cell(tr, fmtLoss(lastLossOf(r)), 'last-loss');
    if (r.room?.eval_version !== null && r.room?.eval_version !== undefined) {
      last.title = `the room's global eval loss of version ${r.room.eval_version} (the median of its workers' measures)`;
    }
    cell(tr, fmtLoss(bestEvalOf(r)), 'best-eval');
    cell(tr, elapsedOf(r) === null ? '–' : fmtDuration(elapsedOf(r)));
    cell(tr, new Date(r.created_at * 1000).toLocaleString());
    const ex = document.createElement('span');
    ex.append(link(`${routePath('get_metrics', { run_id: r.id })}?format=csv`, 'csv'), ' ',
      link(routePath('get_metrics', { run_id: r.id }), 'json'));
    cell(tr, ex);
    const actions = document.createElement('span');
    const rename = Object.assign(document.createElement('button'), { className: 'secondary rename', textContent: 'Rename' });
    rename.setAttribute('aria-label', `Rename ${shownText(r.name)}`);
    rename.onclick = () => startRename(r);
    const del = Object.assign(document.createElement('button'), { className: 'danger delete', textContent: 'Delete' });
    del.onclick = () => deleteRun(r);
    actions.append(rename, ' ', del);
    cell(tr, actions, 'actions');
  }
  if (!shown.length) {
    cell(tbody.insertRow(), state.runs.length ? 'No run matches the filter.'
      : 'No runs yet: start one from New run.').colSpan = 12;
  }
  if (editing) {
    editing.focus();
    if (selection) editing.setSelectionRange(...selection);
  }
  const more = state.total > state.runs.length ? ` (${state.total} stored)` : '';
  document.getElementById('count').textContent = `${shown.length} of ${state.runs.length} runs${more}`;
  button.disabled = state.selected.size < 2;
  for (const b of document.querySelectorAll('button.sort')) {
    b.textContent = b.textContent.replace(/ [▲▼]$/, '') + (b.dataset.key === state.sort.key ? (state.sort.dir > 0 ? ' ▲' : ' ▼') : '');
  }
}

/** Renaming `r` in place: its name becomes an input with Save and Cancel (Enter saves,
 *  Escape cancels), focused with the name selected. One row at a time. */
function startRename(r) {
  if (state.renaming?.id !== r.id) state.renaming = renameForm(r);
  render();
  state.renaming.input.focus();
  state.renaming.input.select();
}

function renameForm(r) {
  // noValidate: an empty name gets this row's message (why), not the browser's bubble.
  const form = Object.assign(document.createElement('form'), { className: 'rename-form', noValidate: true });
  const input = Object.assign(document.createElement('input'), { type: 'text', value: r.name,
    required: true, autocomplete: 'off' });
  input.setAttribute('aria-label', `New name for ${shownText(r.name)}`);
  const save = Object.assign(document.createElement('button'), { type: 'submit', className: 'save',
    textContent: 'Save' });
  const cancel = Object.assign(document.createElement('button'), { type: 'button',
    className: 'secondary cancel', textContent: 'Cancel' });
  // Why it was not renamed, read out when it appears (role=alert) and tied to the input.
  const why = Object.assign(document.createElement('small'), { className: 'error', id: `rename-why-${r.id}` });
  why.setAttribute('role', 'alert');
  input.setAttribute('aria-describedby', why.id);
  form.append(input, ' ', save, ' ', cancel, why);
  const edit = { id: r.id, form, input, why, save };
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    saveRename(edit).catch((err) => { why.textContent = `Not renamed: ${err.message}`; });
  });
  cancel.addEventListener('click', () => endRename(r.id));
  form.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return;
    e.preventDefault();
    endRename(r.id);
  });
  return edit;
}

async function saveRename({ id, input, why, save }) {
  const name = input.value.trim();
  if (!name) {
    why.textContent = 'A run needs a name.';
    input.focus();
    return;
  }
  save.disabled = true;
  try {
    const res = await fetch(routePath('update_run', { run_id: id }), withToken(id, jsonBody('PATCH', { name })));
    if (!res.ok) {
      why.textContent = `Not renamed: ${await responseDetail(res)}`;
      input.focus();
      return;
    }
  } finally {
    save.disabled = false;
  }
  await endRename(id, true);
}

/** The rename of run `id` over (saved: the list read again, with its new name); the focus goes
 *  back to the row's Rename button. */
async function endRename(id, saved = false) {
  if (state.renaming?.id !== id) return;
  state.renaming = null;
  render();
  if (saved) {
    state.lastText = null;
    await refresh();
  }
  tbody.querySelector(`tr[data-run-id="${id}"] button.rename`)?.focus();
}

async function deleteRun(r) {
  if (!confirm(`Delete ${shownText(r.name)} (${r.id})? Its metrics, samples, checkpoints and weights are ` +
    'removed for good.')) return;
  const res = await fetch(routePath('delete_run', { run_id: r.id }), withToken(r.id, { method: 'DELETE' }));
  if (!res.ok && res.status !== 404) {
    alert(`Not deleted: ${await responseDetail(res)}`);
  }
  state.selected.delete(r.id);
  state.lastText = null;
  await refresh();
}

/** The URL of a Link header's rel="next" (null: no more pages). */
const nextPage = (link) => /<([^>]+)>\s*;\s*rel="next"/.exec(link ?? '')?.[1] ?? null;

/** The first `state.pages` pages of the runs list, each page's Link header naming the next. */
async function readPages() {
  const texts = [];
  let url = routePath('list_runs');
  let total = null;
  for (let i = 0; i < state.pages && url; i++) {
    const res = await fetch(url);
    if (!res.ok) return null;
    texts.push(await res.text());
    total = Number(res.headers.get('X-Total-Count') ?? NaN);
    url = nextPage(res.headers.get('Link'));
  }
  return { texts, total, more: url !== null };
}

async function refresh() {
  const read = await readPages();
  if (!read) return;
  older.hidden = !read.more;
  const text = read.texts.join('\n');
  if (text === state.lastText) return;   // nothing changed: the rows (and a pending click) stay
  state.lastText = text;
  state.runs = read.texts.flatMap((t) => JSON.parse(t));
  state.total = Number.isNaN(read.total) ? null : read.total;
  const ids = new Set(state.runs.map((r) => r.id));
  for (const id of [...state.selected]) if (!ids.has(id)) state.selected.delete(id);
  if (state.renaming && !ids.has(state.renaming.id)) state.renaming = null;   // deleted meanwhile
  const statuses = [...new Set(state.runs.map((r) => labelOf(r)))].sort();
  const have = [...statusFilter.options].map((o) => o.value);
  for (const s of statuses) if (!have.includes(s)) statusFilter.append(new Option(s, s));
  render();
}

async function main() {
  tbody.addEventListener('change', (e) => {
    if (e.target.type !== 'checkbox') return;
    if (e.target.checked) state.selected.add(e.target.value); else state.selected.delete(e.target.value);
    button.disabled = state.selected.size < 2;
  });
  button.addEventListener('click', () => {
    // In the order shown; the compare page picks fp32 AdamW as its baseline by default.
    const ids = [...tbody.querySelectorAll('input:checked')].map((b) => b.value);
    location.href = `${routePath('compare')}?ids=${ids.join(',')}`;
  });
  for (const b of document.querySelectorAll('button.sort')) {
    b.addEventListener('click', () => {
      state.sort = { key: b.dataset.key, dir: state.sort.key === b.dataset.key ? -state.sort.dir : 1 };
      render();
    });
  }
  filter.addEventListener('input', render);
  older.addEventListener('click', () => {
    state.pages += 1;
    refresh().catch(() => {});
  });
  statusFilter.addEventListener('change', render);
  await refresh();
  document.body.dataset.ready = '1';
  setInterval(() => { if (!document.hidden) refresh().catch(() => {}); }, POLL_MS);
}

main();
