// A room run's page (server/room/): the room's global eval loss per version (the median of the
// workers' measures, and the reports far from it), each worker's inner losses in its own
// colour, who joined and left, what each does now (training step k of H, sending, waiting,
// left) and what the open round waits for, and what each sent beside what per-step fp32
// all-reduce would have sent; the run's owner may remove a worker. A tab opened from the room's
// join link (#join=...) says what joining means and joins with one click ("Join and train"):
// the engine's RoomWorker (engine/room_worker.js) trains on this GPU, the room's network handed
// to it as functions. A worker that left (or whose tab reloaded) may join again as itself.
// "Did the room help?": the global eval loss against the tokens each worker trained, beside
// each worker's training loss and the lone tab's (the newest single run that trains what one
// worker trains: GET .../room/lone, followed live as its own page is); without one, a button
// makes one (the room's config less its room) and opens its page in a new tab to train it.
import { createContext } from '../engine/context.js';
import { RoomWorker } from '../engine/room_worker.js';
import { fetchLoader } from '../engine/shaders.js';
import {
  fetchJson, fetchRetrying, heldWorkerId, heldWorkerToken, jsonBody, responseDetail, resumeLink,
  saveToken, saveWorkerToken, takeJoinToken, withToken,
} from './api.js';
import { SHADER_BASE } from './assets.js';
import { COLORS, Chart, Throttle, fmtBytes, fmtCount } from './charts.js';
import { routePath } from './facts.js';
import { TOKENS_AXIS, helpedSeries, helpedText } from './room_series.js';
import { roundText, workerNow } from './room_words.js';
import { statusLabel } from './run_status.js';
import { $, setStatus, showError, stat } from './run_view.js';
import { setShown } from './text.js';
import { watch } from './telemetry.js';

const body = document.body;
const runId = $('room').dataset.runId;
// A worker waiting for the next global version hears it close on the run's websocket (the
// room's 'version' event) and reads the room then; it also looks every POLL_MS in case the
// socket is down.
const POLL_MS = 2000;
const REPORTS_PAGE = 1000;       // reports per request (the server's most)
const PROGRESS_MS = 1000;        // a worker tells its inner step at most this often (and its last)

// workerStatus: [text, class] of this tab's worker once it joins (null: the room's status).
// skew: the server's clock minus this tab's (s), so a round's deadline counts down by the
// server's. joined: this tab's worker id while it trains here.
// loneInfo: GET .../room/lone's answer; lone: the lone tab followed ({id, run, records: step ->
// record, stop}), or null.
// cut: the versions whose round the room cut (wait_for_slowest off: half the workers sent a whole
// round), from its websocket's events and GET room: this tab's worker sends what it has.
const state = { run: null, room: null, reports: [], worker: null, workerStatus: null, charts: null,
  skew: 0, joined: null, loneInfo: null, lone: null, helped: null, cut: new Set() };

/** Resolves at the room's next 'version' event (a round closed): taken before a read of the
 *  room, so an event during the read is not missed. */
let versionClosed = null;
function nextClose() {
  if (!versionClosed) {
    let resolve;
    versionClosed = new Promise((r) => { resolve = r; });
    versionClosed.resolve = resolve;
  }
  return versionClosed;
}
function heardClose() {
  versionClosed?.resolve();
  versionClosed = null;
}

function joinLink(token) {
  return `${location.origin}${routePath('run_page', { run_id: runId })}#join=${encodeURIComponent(token)}`;
}

/** Every worker's report, page by page (the server answers at most REPORTS_PAGE at once). */
async function fetchReports() {
  const reports = [];
  for (let offset = 0; offset !== null;) {
    const page = await fetchJson(`${routePath('get_room_reports', { run_id: runId })}` +
      `?offset=${offset}&limit=${REPORTS_PAGE}`);
    reports.push(...page.reports);
    offset = page.reports.length ? page.next : null;   // (an empty page ends it whatever it says)
  }
  return reports;
}

/** The room again, and its reports unless `reports` is false (a worker's step: only the room
 *  changed). */
async function refresh(reports = true) {
  const [room, got] = await Promise.all([
    fetchJson(routePath('get_room', { run_id: runId })), reports ? fetchReports() : null,
  ]);
  state.room = room;
  if (room.open.cut) state.cut.add(room.version);
  state.skew = room.now - Date.now() / 1000;
  if (got) state.reports = got;
  show();
}

function showRound() {
  if (!state.room) return;
  const text = roundText(state.room, Date.now() / 1000 + state.skew);
  $('round-status').textContent = text;
  $('round-status').dataset.waitingFor = String(state.room.open.waiting_for?.length ?? 0);
}

/** What joining means, before anything is joined: the model, this tab's GPU, the rounds. */
function showOffer() {
  const { run, room } = state;
  const cfg = run.config;
  const H = room.config.inner_steps;
  const active = room.workers.filter((w) => w.left === null).length;
  const held = heldWorkerId(runId);
  const mine = held === null ? null : room.workers.find((w) => w.worker === held);
  const again = mine && !mine.removed;
  $('join-what').textContent = `Joining makes this tab one of the room's workers: this tab's ` +
    `GPU (WebGPU) trains the ${run.model_name} model (${fmtCount(run.n_params)} parameters) ` +
    `with the others. A round is ${H} inner steps on this tab's own batches (${cfg.batch_size} ` +
    `x ${cfg.seq_len} tokens each) from the room's global weights; then it sends what it ` +
    `learned (${fmtBytes(room.delta_bytes)}, ${room.config.codec}) and takes the next global ` +
    `version. The room has ${room.rounds} rounds (${room.version} done; ${active} ` +
    `worker${active === 1 ? '' : 's'} training now). Keep this tab open while it trains; ` +
    'Leave stops it.';
  $('join').textContent = again ? `Rejoin as worker ${held}` : 'Join and train';
  $('join').title = again ? `train in the room again as worker ${held} (this tab's worker before)`
    : 'train this room\'s model on this tab\'s GPU, with the others';
}

/** The page's status: this tab's worker's once it joined, else the room's; and what the room's
 *  open round waits for (a close that cannot reserve disk), whichever it is. */
function showStatus() {
  const { room } = state;
  const [text, cls] = state.workerStatus
    ?? [room.finished ? 'finished' : `training version ${room.version}`, 'ok'];
  const waiting = room.open.waiting ?? null;
  setStatus(waiting ? `${text}, ${waiting}` : text, waiting && cls !== 'bad' ? 'warn' : cls);
  if (waiting) body.dataset.waiting = waiting;
  else delete body.dataset.waiting;
}

function show() {
  const { room } = state;
  const cfg = room.config;
  const active = room.workers.filter((w) => w.left === null).length;
  const joined = `${room.workers.length} joined`;
  stat('version', `${room.version} of ${room.rounds}`, 'global version');
  stat('workers', room.finished ? `none training: finished (${joined})` : `${active} training (${joined})`, 'workers');
  stat('round', `${cfg.inner_steps} inner steps${cfg.wait_for_slowest ? '' : ' (cut once half are done)'}` +
    `${cfg.overlap ? ', overlapped (the next round trains while one closes)' : ''}`, 'round');
  stat('outer', cfg.outer_momentum === 0 && cfg.outer_lr === 1 ? "the workers' mean weights"
    : `Nesterov lr ${cfg.outer_lr}, momentum ${cfg.outer_momentum}`, 'outer step');
  stat('codec', `${cfg.codec}: ${fmtBytes(room.delta_bytes)} per pseudo-gradient`, 'sent as');
  if (!state.worker) body.dataset.status = room.finished ? 'finished' : 'running';
  showStatus();
  showRound();
  if (!$('join-offer').hidden) {
    if (room.finished) {
      $('join-offer').hidden = true;
      $('join').hidden = true;
    } else showOffer();
  }
  drawCharts();
  drawHelped();
  drawWorkers();
}

/** The global eval loss's columns: per version its median (the room's evals), then at the
 *  same version each outlier's reported value, one x each (x repeats; uPlot draws each point).
 *  -> [xs, medians, far from the median]. */
function evalColumns(evals, reports) {
  const reported = new Map();   // "version worker" -> that worker's eval loss of that version
  for (const r of reports) if (r.eval_loss !== null) reported.set(`${r.version} ${r.worker}`, r.eval_loss);
  const cols = [[], [], []];
  for (const e of [...evals].sort((a, b) => a.version - b.version)) {
    cols[0].push(e.version);
    cols[1].push(e.median);
    cols[2].push(null);
    for (const w of e.outliers) {
      const loss = reported.get(`${e.version} ${w}`);
      if (loss === undefined) continue;   // (a report newer than the reports read)
      cols[0].push(e.version);
      cols[1].push(null);
      cols[2].push(loss);
    }
  }
  return cols;
}

function drawCharts() {
  if (!state.charts) {
    state.charts = {
      eval: new Chart($('charts'), 'global eval loss', [
        { label: 'median of the workers', points: true },
        { label: 'far from the median', points: true, color: COLORS[3] },
      ], { y: 'loss', x: 'global version', placeholder: 'No version measured yet.' }),
      inner: null, workers: 0,
    };
  }
  const evals = state.room.evals;
  state.charts.eval.setData(evalColumns(evals, state.reports));
  const box = state.charts.eval.box.dataset;
  box.versions = String(evals.length);
  box.outliers = String(evals.reduce((n, e) => n + e.outliers.length, 0));
  // Inner losses: per worker, at the global inner step (version x H + i).
  const H = state.room.config.inner_steps;
  const ids = state.room.workers.map((w) => w.worker);
  if (!state.charts.inner || state.charts.workers !== ids.length) {
    state.charts.inner?.destroy();
    state.charts.inner = new Chart($('charts'), 'inner loss per worker',
      ids.map((id) => ({ label: `worker ${id}`, color: COLORS[id % COLORS.length] })),
      { y: 'loss', x: 'inner step', placeholder: 'No round reported yet.' });
    state.charts.workers = ids.length;
  }
  const byStep = new Map();
  for (const r of state.reports) {
    r.losses.forEach((loss, i) => {
      const step = r.version * H + i + 1;
      if (!byStep.has(step)) byStep.set(step, new Map());
      byStep.get(step).set(r.worker, loss);
    });
  }
  const steps = [...byStep.keys()].sort((a, b) => a - b);
  state.charts.inner.setData([steps, ...ids.map((id) => steps.map((s) => byStep.get(s).get(id) ?? null))]);
}

// ---- did the room help? -------------------------------------------------------------------

const LONE_COLOR = '#d81b60';
const helpedStyle = (s) => {
  if (s.key === 'global') return { color: '#111111', width: 2.5 };
  if (s.key === 'lone eval') return { color: LONE_COLOR, width: 2.5, dash: [8, 4] };
  if (s.key === 'lone train') return { color: `${LONE_COLOR}80`, width: 1, dash: [2, 3] };
  return { color: `${COLORS[s.worker % COLORS.length]}80`, width: 1 };   // a worker's, thin
};

/** The "did the room help?" chart and its words, from the room, its reports and the lone tab. */
function drawHelped() {
  if (!state.room) return;
  const lone = state.lone?.run ? { id: state.lone.id, config: state.lone.run.config,
    records: [...state.lone.records.values()] } : null;
  const shaped = helpedSeries(state.room, state.reports, state.run.config, lone);
  const keys = shaped.series.map((s) => s.key).join('|');
  if (state.helped?.keys !== keys) {   // (a worker reported first, or the lone tab came)
    state.helped?.chart.destroy();
    const chart = new Chart($('helped-chart'), 'the room beside one tab alone',
      shaped.series.map((s) => ({ label: s.label, ...helpedStyle(s) })),
      { y: 'loss', x: TOKENS_AXIS, group: 'helped', height: 300,
        placeholder: 'No loss measured yet.' });
    state.helped = { chart, keys };
    window.andreaHelped = chart;       // tests read its columns
  }
  const { chart } = state.helped;
  chart.setData(shaped.cols);
  Object.assign(chart.box.dataset, {
    versions: String(shaped.counts.versions), workers: String(shaped.counts.workers),
    lone: lone?.id ?? '', loneEvals: String(shaped.counts.loneEvals),
    loneSteps: String(shaped.counts.loneSteps) });
  $('helped-text').textContent = state.loneInfo ? helpedText(shaped, Boolean(lone)) : '';
  const info = state.loneInfo;
  $('train-alone').hidden = !info || info.run !== null;
  $('lone-line').hidden = !lone;
  if (lone) {
    const { run } = state.lone;
    const link = $('lone-link');
    link.href = routePath('run_page', { run_id: lone.id });
    setShown(link, run.name);
    let last = 0;
    for (const step of state.lone.records.keys()) last = Math.max(last, step);
    $('lone-status').textContent = ` (${statusLabel(run)}, step ${last} of ${run.config.steps}): ` +
      `batch ${run.config.batch_size} x ${run.config.seq_len} tokens a step, as each worker's.`;
  }
}
const helpedSoon = new Throttle(500, drawHelped);

/** The lone tab now (GET .../room/lone), followed live when it is another than before; one
 *  look at a time (the page's start, a new lone tab, one deleted). */
let looking = Promise.resolve();
function findLone() {
  looking = looking.catch(() => {}).then(lookForLone);
  return looking;
}

async function lookForLone() {
  const info = await fetchJson(routePath('get_room_lone', { run_id: runId }));
  state.loneInfo = info;
  $('train-alone').title = info.run ? '' : `${info.why}: a single run of this room's model, ` +
    'batch, optimizer, lr, seed and steps (each worker\'s), trained in a new tab';
  if (info.run !== (state.lone?.id ?? null)) {
    state.lone?.stop();
    state.lone = null;
    if (info.run) await followLone(info.run);
  }
  drawHelped();
}

/** Follows single run `id`: its records (the backlog, then each as it commits) and its row. */
async function followLone(id) {
  const lone = { id, run: await fetchJson(routePath('get_run', { run_id: id })), records: new Map(),
    stop: () => {} };
  state.lone = lone;
  lone.stop = watch(id, (msg) => {
    if (state.lone !== lone) return;
    if (msg.type === 'records') {
      for (const r of msg.records) {   // (what the chart draws: not its per-row losses)
        lone.records.set(r.step, { step: r.step, loss: r.loss, eval_loss: r.eval_loss });
      }
    } else if (msg.type === 'resumed' && msg.kind === undefined) {   // it goes on from msg.step
      for (const step of [...lone.records.keys()]) if (step > msg.step) lone.records.delete(step);
    } else if (msg.type === 'run') {
      lone.run = { ...lone.run, ...msg.run };
    } else if (msg.type === 'deleted') {
      findLone().catch(() => {});
      return;
    }
    helpedSoon.request();
  });
}

/** One click: a single run of the room's config less its room (each worker's steps, the same
 *  seed: the same version 0), its page opened in a new tab, which trains it (the run's token
 *  rides in the link's fragment, never sent to a server: api.js resumeLink). */
async function trainAlone(button) {
  button.disabled = true;
  $('train-alone-status').textContent = 'Creating the run…';
  // Opened now, in the click: a tab opened after an await may be blocked as a pop-up.
  const tab = window.open('', '_blank');
  try {
    const run = await fetchJson(routePath('create_run'), jsonBody('POST', state.loneInfo.config));
    saveToken(run.id, run.token);
    const url = resumeLink(location.origin, run.id, run.token);
    if (tab) tab.location.href = url;
    const name = [...`${state.run.name} · one tab alone`].slice(0, 120).join('');   // (NAME_MAX)
    await fetch(routePath('update_run', { run_id: run.id }),
      withToken(run.id, jsonBody('PATCH', { name }))).catch(() => {});
    // (the link with the token only where no tab trains it yet: it is the run's write token)
    const open = Object.assign(document.createElement('a'), { target: '_blank',
      href: tab ? routePath('run_page', { run_id: run.id }) : url, textContent: 'its page' });
    $('train-alone-status').replaceChildren(tab ? 'Training it in a new tab (' : 'Open ', open,
      tab ? '); keep that tab open.' : ' to train it (this browser blocked the new tab).');
    await findLone();
  } catch (e) {
    tab?.close();
    $('train-alone-status').textContent = '';
    showError(`No lone tab made: ${e.message}`);
  } finally {
    button.disabled = false;
  }
}

// Each worker's Remove button, one element kept across redraws (the rows are rebuilt with every
// update, up to once a second a worker): a click whose press and release straddle a redraw
// still lands on it, where a new button each time lost it.
const removeButtons = new Map();

function removeButton(id) {
  let remove = removeButtons.get(id);
  if (!remove) {
    remove = Object.assign(document.createElement('button'), {
      className: 'danger remove', textContent: 'Remove',
      title: 'the run\'s owner only: this worker leaves the room, and its token can never rejoin' });
    remove.onclick = () => removeWorker(id, remove);
    removeButtons.set(id, remove);
  }
  return remove;
}

function drawWorkers() {
  const { room } = state;
  const perRound = room.allreduce_bytes_per_step * room.config.inner_steps;
  const H = room.config.inner_steps;
  const rows = room.workers.map((w) => {
    const mine = w.worker === state.joined ? ' (this tab)' : '';
    const cells = [w.worker, workerNow(w, H) + mine, w.slot, new Date(w.joined * 1000).toLocaleTimeString(),
      w.left === null ? '' : `${new Date(w.left * 1000).toLocaleTimeString()} (${w.why})`,
      w.deltas, fmtBytes(w.bytes), fmtBytes(w.deltas * perRound), w.stale, w.refused];
    const tr = document.createElement('tr');
    tr.dataset.worker = String(w.worker);
    tr.dataset.state = w.state ?? '';
    for (const c of cells) {
      const td = document.createElement('td');
      td.textContent = String(c);
      tr.append(td);
    }
    const td = document.createElement('td');
    // As the run page's edit form: whether this tab may act as the run's owner (its token, or
    // the local owner of a loopback server) is the server's to say, and a refusal says why.
    if (w.left === null && !room.finished) td.append(removeButton(w.worker));
    tr.append(td);
    return tr;
  });
  $('workers').tBodies[0].replaceChildren(...rows);
  const sent = room.workers.reduce((a, w) => a + w.bytes, 0);
  const would = room.workers.reduce((a, w) => a + w.deltas * perRound, 0);
  $('traffic').textContent = sent ? `The room sent ${fmtBytes(sent)} of pseudo-gradients; ` +
    `per-step fp32 gradient all-reduce would have sent ${fmtBytes(would)} ` +
    `(${Math.round(would / sent)}x more).` : 'Nothing sent yet.';
}

/** The run's owner removes worker `id` (DELETE, with the run's token where this tab holds it):
 *  it shows left, and its token can never rejoin. */
async function removeWorker(id, button) {
  if (!confirm(`Remove worker ${id} from the room? It stops training here, and its token can ` +
    'never rejoin.')) return;
  button.disabled = true;
  try {
    const res = await fetch(routePath('remove_room_worker', { run_id: runId, worker: id }),
      withToken(runId, { method: 'DELETE' }));
    if (!res.ok) throw new Error(await responseDetail(res));
  } catch (e) {
    showError(`Worker ${id} not removed: ${e.message}`);
    button.disabled = false;
    return;
  }
  await refresh();
}

/** The room's network, as the engine's RoomWorker asks for it. Every call rides out a server
 *  restart (fetchRetrying): a round waits for the server rather than failing. */
function roomNetwork(me) {
  const auth = { authorization: `Bearer ${me.token}` };
  const bytes = (url) => fetchRetrying(url).then((r) => r.arrayBuffer());
  const send = (url, init, accept = []) => fetchRetrying(url,
    { ...init, headers: { ...auth, ...(init.headers ?? {}) } }, { accept });
  return {
    weights: async (v) => {   // 410: no longer kept (the room moved on): null
      const res = await fetchRetrying(routePath('get_room_weights', { run_id: runId, version: v }),
        {}, { accept: [410] });
      return res.status === 410 ? null : res.arrayBuffer();
    },
    update: async (v) => {    // 404: not kept as an update (not the newest, or not int8)
      const res = await fetchRetrying(routePath('get_room_update', { run_id: runId, version: v }),
        {}, { accept: [404] });
      return res.status === 404 ? null : res.arrayBuffer();
    },
    // 409: the round closed without this one (stale), or a retry of one that arrived: either
    // way training goes on. 422 (refused: not finite) is thrown.
    send: (v, buf, steps) => send(
      `${routePath('post_room_delta', { run_id: runId, version: v })}?steps=${steps}`,
      { method: 'POST', body: buf }, [409]),
    cut: (v) => state.cut.has(v),
    // 409: this version's report is in already (a retry whose answer was lost, or a tab that
    // reloaded); 507: the run's storage budget holds no more reports. Training goes on.
    // timings: how this worker spent version v (room_worker.js's header), kept with the report.
    report: (v, losses, evalLoss, timings) => send(routePath('post_room_report', { run_id: runId, version: v }), {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ losses: losses.filter((x) => Number.isFinite(x)),
        eval_loss: Number.isFinite(evalLoss) ? evalLoss : null, timings }) }, [409, 507]),
    nextVersion: async (after, signal = null) => {
      const left = new Promise((r) => signal?.addEventListener('abort', r, { once: true }));
      for (;;) {
        if (signal?.aborted) return null;   // the worker left while it waited
        const closed = nextClose();
        const room = await bytes(routePath('get_room', { run_id: runId }))
          .then((b) => JSON.parse(new TextDecoder().decode(b)));
        if (room.version > after || room.finished) return room.version;
        // Removed by the run's owner (or dropped for missed rounds) meanwhile: the room would
        // refuse what this one sends next, so it ends now, saying why.
        const mine = room.workers.find((w) => w.worker === me.worker);
        if (mine && mine.left !== null) throw new Error(`worker ${me.worker} left the room (${mine.why})`);
        await Promise.race([closed, left, new Promise((r) => setTimeout(r, POLL_MS))]);
      }
    },
  };
}

function workerStatus(text, cls = '') {
  state.workerStatus = [text, cls];
  showStatus();
}

/** Tells the room this worker's inner step (POST .../progress/{v}): at most every PROGRESS_MS,
 *  the latest one last, and the round's first and last step at once; one request at a time.
 *  A refusal (the round moved on, the worker left) is nothing to act on: it is not retried. */
function progressTeller(me, H) {
  let latest = null;
  let told = null;
  let busy = false;
  let timer = null;
  let lastAt = -Infinity;
  const post = async () => {
    timer = null;
    if (busy || latest === told) return;
    busy = true;
    lastAt = performance.now();
    const p = told = latest;
    try {
      await fetch(routePath('post_room_progress', { run_id: runId, version: p.version }), {
        method: 'POST', body: JSON.stringify({ step: p.step }),
        headers: { authorization: `Bearer ${me.token}`, 'content-type': 'application/json' } });
    } catch { /* the next step tells it again */ }
    busy = false;
    if (latest !== told) later();
  };
  const later = () => {
    timer ??= setTimeout(post, Math.max(0, lastAt + PROGRESS_MS - performance.now()));
  };
  return {
    /** rec: a Trainer record (its step counts from 1 over every round: round r's steps are
     *  r * H + 1 .. (r + 1) * H). */
    record(rec) {
      const version = Math.floor((rec.step - 1) / H);
      const step = rec.step - version * H;
      latest = { version, step };
      if ((step === 1 || step === H) && !busy) {
        clearTimeout(timer);
        post();
      } else later();
    },
    stop() {
      clearTimeout(timer);
      latest = told;
    },
  };
}

async function join(token) {
  $('join').hidden = true;
  $('join-offer').hidden = true;
  $('error').hidden = true;   // (why a join before failed: this one is another try)
  delete body.dataset.done;
  workerStatus('Joining the room…');
  const again = heldWorkerToken(runId);   // this tab was a worker before (it reloaded, or left)
  const res = await fetch(routePath('join_room', { run_id: runId }), { method: 'POST',
    headers: { authorization: `Bearer ${token}`, ...(again ? { 'x-andrea-worker-token': again } : {}) } });
  if (!res.ok) throw new Error(`could not join: ${await responseDetail(res)}`);
  const me = await res.json();
  saveWorkerToken(runId, me.token, me.worker);
  state.joined = me.worker;
  body.dataset.worker = String(me.worker);
  $('mode').textContent = `(worker ${me.worker} trains here)`;
  const config = state.run.config;
  const H = config.room.inner_steps;
  let ended = false;        // the device is given back when the worker ends: not a loss then
  const ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE),
    onError: (m) => showError(`GPU error: ${m}`), onLost: (m) => { if (!ended) showError(m); },
    mixed: config.precision === 'mixed' ? 'required' : false });
  const teller = progressTeller(me, H);
  let worker = null;
  let closing = null;       // the pagehide listener that leaves the room while this one trains
  let end;
  try {
    const [layout, maps] = await Promise.all([
      fetchRetrying(routePath('get_run_layout', { run_id: runId })).then((r) => r.json()),
      fetchRetrying(routePath('optimizer_maps')).then((r) => r.json()),
    ]);
    workerStatus('Compiling kernels and taking the global weights…');
    if (window.andreaGpuOnly && ctx.software) {   // `andrea train --gpu`: never a fallback
      throw new Error(`the browser offered only a software WebGPU adapter (${ctx.info.vendor} ` +
        `${ctx.info.architecture}), and this worker was asked to train on the GPU`);
    }
    worker = await RoomWorker.create({
      ctx, layout, config, maps, version: me.version, room: roomNetwork(me),
      loadBatch: (v, step) => fetchRetrying(routePath('room_batch',
        { run_id: runId, version: v, slot: me.slot, step })).then((r) => r.arrayBuffer()),
      loadValBatch: (i) => fetchRetrying(routePath('run_val_batch', { run_id: runId, index: i }))
        .then((r) => r.arrayBuffer()),
      stepDelayMs: window.andreaStepDelayMs ?? 0,   // bench/room.py's slow tab; else 0
      on: {
        record: (rec) => teller.record(rec),
        status: (status, message) => {
          body.dataset.workerStatus = status;
          workerStatus(`worker ${me.worker}: ${status}${message ? `: ${message}` : ''}`,
            status === 'failed' ? 'bad' : 'ok');
        },
        round: () => refreshSoon(true).catch(() => {}),
      },
    });
    state.worker = worker;
    window.andreaTrainer = worker.trainer;   // `andrea train` reads its stats and stops it
    window.andreaRoomWorker = worker;        // tests read where versions arrived (moves)
    $('leave').hidden = false;
    $('leave').onclick = () => {
      $('leave').disabled = true;
      worker.stop('left the room');
    };
    // A closed (or navigated away) tab leaves the room as it goes, so the round it was in
    // closes on the others' at once instead of waiting out its deadlines; keepalive lets the
    // request outlive the page. A reload rejoins as the same worker (heldWorkerToken).
    closing = () => {
      fetch(routePath('leave_room', { run_id: runId }), { method: 'DELETE', keepalive: true,
        headers: { authorization: `Bearer ${me.token}` } }).catch(() => {});
    };
    window.addEventListener('pagehide', closing);
    end = await worker.run();
  } finally {
    if (closing) window.removeEventListener('pagehide', closing);
    teller.stop();
    worker?.destroy();
    ended = true;
    ctx.destroy();            // a rejoin makes its own
    $('leave').hidden = true;
    $('leave').disabled = false;
    state.worker = null;
    state.joined = null;
    if (end !== 'finished') {   // stopped, failed, or thrown: its slot goes to another tab
      await fetch(routePath('leave_room', { run_id: runId }),
        { method: 'DELETE', headers: { authorization: `Bearer ${me.token}` } }).catch(() => {});
    }
  }
  await refresh().catch(() => {});
  if (end !== 'finished') offerJoin(token);
  body.dataset.done = end;      // last: the page shows the room as it ended
}

/** Joins with `token` (the room's join token), and says why where it could not. */
function start(token) {
  return join(token).catch((e) => {
    showError(e.message || String(e));
    body.dataset.done = 'failed';
    offerJoin(token);
  });
}

/** The join offer (what joining means, and the button) while the room trains; pressing it
 *  joins (again, as this tab's worker where it was one). */
function offerJoin(token) {
  if (state.room.finished) return;
  const mine = state.room.workers.find((w) => w.worker === heldWorkerId(runId));
  if (mine?.removed) return;          // removed by the run's owner: it may not come back
  $('join-offer').hidden = false;
  showOffer();
  $('join').hidden = false;
  $('join').onclick = () => start(token);
}

/** refresh(), coalesced: one at a time, and one more after it where asked meanwhile. */
const pending = { busy: false, again: null };
async function refreshSoon(reports) {
  if (pending.busy) {
    pending.again = pending.again || reports;
    return;
  }
  pending.busy = true;
  try {
    await refresh(reports);
  } finally {
    pending.busy = false;
  }
  if (pending.again !== null) {
    const more = pending.again;
    pending.again = null;
    await refreshSoon(more);
  }
}

async function main() {
  const token = takeJoinToken(runId);   // from the join link, or kept by this tab
  const res = await fetch(routePath('get_run', { run_id: runId }));
  if (!res.ok) {
    setStatus(`No run ${runId} here.`, 'bad');
    return;
  }
  state.run = await res.json();
  await refresh();
  $('train-alone').onclick = () => trainAlone($('train-alone'));
  await findLone().catch((e) => showError(`No lone tab to compare with: ${e.message}`));
  // A worker's step changes only the room (not its reports): the room alone is read again, at
  // most once a second however many workers tell theirs.
  const steps = new Throttle(PROGRESS_MS, () => refreshSoon(false).catch(() => {}));
  watch(runId, (msg) => {
    if (msg.type === 'room' && msg.event === 'cut') state.cut.add(msg.version);
    if (msg.type === 'room' && msg.event === 'version') heardClose();
    if (msg.type === 'room' && msg.event === 'progress') steps.request();
    else if (msg.type === 'room' || msg.type === 'run') refreshSoon(true).catch(() => {});
  });
  setInterval(showRound, 1000);         // the round's deadline counts down
  if (token) {
    $('copy-join').hidden = false;
    $('copy-join').onclick = async () => {
      const link = joinLink(token);
      try {
        await navigator.clipboard.writeText(link);
        $('copy-join-status').textContent = 'Copied.';
      } catch {
        prompt('The join link (anyone who opens it may train in this room):', link);
      }
    };
    if (window.andreaAutoJoin && !state.room.finished) start(token);   // `andrea train --join` (server/cli/chromium.py)
    else offerJoin(token);
  }
  body.dataset.ready = '1';
}

main().catch((e) => {
  showError(e.message || String(e));
  body.dataset.done = 'failed';
});
