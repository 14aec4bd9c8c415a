// Runs list: name, tags, status, progress, losses, time; sort and filter; rename and delete;
// pick runs to compare. It polls the API every few seconds, so it follows runs as they change.
import { jsonBody, responseDetail, withToken } from './api.js';
import { fmtDuration } from './format.js';
import { statusLabel } from './run_status.js';
import { setShown, shownText } from './text.js';

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
const elapsedOf = (r) => (r.first_time && r.last_time ? r.last_time - r.first_time : null);
const progressOf = (r) => (r.last_step ?? 0) / r.config.steps;

/** The sort key of a run (nulls last whichever the direction). */
function keyOf(r, key) {
  if (key === 'progress') return progressOf(r);
  if (key === 'elapsed') return elapsedOf(r);
  if (key === 'preset') return `${r.model_name} ${r.config.optimizer}`;
  if (key === 'name') return r.name.toLowerCase();
  if (key === 'status') return statusLabel(r);
  return r[key] ?? null;
}

function matches(r) {
  if (statusFilter.value && statusLabel(r) !== statusFilter.value) return false;
  const q = filter.value.trim().toLowerCase();
  if (!q) return true;
  const hay = [r.name, r.id, statusLabel(r), r.model_name, r.config.optimizer, ...(r.tags || []),
    r.notes || ''].join(' ').toLowerCase();
  return q.split(/\s+/).every((w) => hay.includes(w));
}

function render() {
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
    name.append(setShown(link(`/runs/${r.id}`, ''), r.name));
    const sub = document.createElement('small');
    sub.className = 'muted';
    sub.textContent = ` ${r.id}`;
    name.append(sub);
    for (const t of r.tags || []) {
      name.append(' ', setShown(Object.assign(document.createElement('span'), { className: 'tag' }), t));
    }
    cell(tr, name, 'name');
    const ck = r.checkpoint?.last_step;
    // What is true now: "never started", "no training tab" (run_status.js), not a stale status.
    const label = statusLabel(r);
    const st = cell(tr, label + (r.can_resume ? ` · resumable from step ${ck}` : ''), 'status');
    st.dataset.status = label;
    st.title = r.message ?? '';       // why it failed, stopped, was interrupted or never started
    cell(tr, `${r.last_step ?? 0} / ${r.config.steps} (${Math.floor(progressOf(r) * 100)} %)`);
    cell(tr, `${r.model_name} · ${r.config.optimizer}${r.config.f16_mirror ? ' + f16' : ''}`);
    cell(tr, fmtLoss(r.last_loss));
    cell(tr, fmtLoss(r.best_eval_loss));
    cell(tr, elapsedOf(r) === null ? '–' : fmtDuration(elapsedOf(r)));
    cell(tr, new Date(r.created_at * 1000).toLocaleString());
    const ex = document.createElement('span');
    ex.append(link(`/api/runs/${r.id}/metrics?format=csv`, 'csv'), ' ',
      link(`/api/runs/${r.id}/metrics`, 'json'));
    cell(tr, ex);
    const actions = document.createElement('span');
    const rename = Object.assign(document.createElement('button'), { className: 'secondary rename', textContent: 'Rename' });
    rename.onclick = () => renameRun(r);
    const del = Object.assign(document.createElement('button'), { className: 'danger delete', textContent: 'Delete' });
    del.onclick = () => deleteRun(r);
    actions.append(rename, ' ', del);
    cell(tr, actions, 'actions');
  }
  if (!shown.length) {
    cell(tbody.insertRow(), state.runs.length ? 'No run matches the filter.'
      : 'No runs yet: start one from New run.').colSpan = 11;
  }
  const more = state.total > state.runs.length ? ` (${state.total} stored)` : '';
  document.getElementById('count').textContent = `${shown.length} of ${state.runs.length} runs${more}`;
  button.disabled = state.selected.size < 2;
  for (const b of document.querySelectorAll('button.sort')) {
    b.textContent = b.textContent.replace(/ [▲▼]$/, '') + (b.dataset.key === state.sort.key ? (state.sort.dir > 0 ? ' ▲' : ' ▼') : '');
  }
}

async function renameRun(r) {
  const name = prompt(`New name for ${shownText(r.name)}`, r.name);
  if (name === null || !name.trim()) return;
  const res = await fetch(`/api/runs/${r.id}`, withToken(r.id, jsonBody('PATCH', { name })));
  if (!res.ok) alert(`Not renamed: ${await responseDetail(res)}`);
  state.lastText = null;
  await refresh();
}

async function deleteRun(r) {
  if (!confirm(`Delete ${shownText(r.name)} (${r.id})? Its metrics, samples, checkpoints and weights are ` +
    'removed for good.')) return;
  const res = await fetch(`/api/runs/${r.id}`, withToken(r.id, { method: 'DELETE' }));
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
  let url = '/api/runs';
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
  const statuses = [...new Set(state.runs.map((r) => statusLabel(r)))].sort();
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
    location.href = `/compare?ids=${ids.join(',')}`;
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
