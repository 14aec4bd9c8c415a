// A room run's page (server/room/): the room's global eval loss per version, each worker's
// inner losses in its own colour, who joined and left and what each sent beside what per-step
// fp32 all-reduce would have sent. A tab opened from the room's join link (#join=...) may join
// and train here: the engine's RoomWorker (engine/room_worker.js) on this GPU, the room's
// network handed to it as functions.
import { createContext } from '../engine/context.js';
import { RoomWorker } from '../engine/room_worker.js';
import { fetchLoader } from '../engine/shaders.js';
import {
  fetchJson, fetchRetrying, heldWorkerToken, responseDetail, saveWorkerToken, takeJoinToken,
} from './api.js';
import { SHADER_BASE } from './assets.js';
import { COLORS, Chart, fmtBytes } from './charts.js';
import { routePath } from './facts.js';
import { $, setStatus, showError, stat } from './run_view.js';
import { watch } from './telemetry.js';

const body = document.body;
const runId = $('room').dataset.runId;
const POLL_MS = 500;             // how often a worker looks for the next global version

const state = { run: null, room: null, reports: [], worker: null, mine: [], charts: null };

function joinLink(token) {
  return `${location.origin}${routePath('run_page', { run_id: runId })}#join=${encodeURIComponent(token)}`;
}

async function refresh() {
  const [room, reports] = await Promise.all([
    fetchJson(routePath('get_room', { run_id: runId })),
    fetchJson(routePath('get_room_reports', { run_id: runId })),
  ]);
  state.room = room;
  state.reports = reports;
  show();
}

function show() {
  const { room } = state;
  const cfg = room.config;
  const active = room.workers.filter((w) => w.left === null).length;
  stat('version', `${room.version ?? '–'} of ${room.rounds}`, 'global version');
  stat('workers', `${active} training (${room.workers.length} joined)`, 'workers');
  stat('round', `${cfg.inner_steps} inner steps`, 'round');
  stat('outer', `Nesterov lr ${cfg.outer_lr}, momentum ${cfg.outer_momentum}`, 'outer step');
  stat('codec', `${cfg.codec}: ${fmtBytes(room.delta_bytes)} per pseudo-gradient`, 'sent as');
  if (!state.worker) {
    const text = room.finished ? 'finished' : room.version === null
      ? 'waiting for its first worker' : `training version ${room.version}`;
    setStatus(text, 'ok');
    body.dataset.status = room.finished ? 'finished' : 'running';
  }
  drawCharts();
  drawWorkers();
}

function drawCharts() {
  if (!state.charts) {
    state.charts = {
      eval: new Chart($('charts'), 'global eval loss', [{ label: 'eval loss', points: true }],
        { y: 'loss', x: 'global version', placeholder: 'No version measured yet.' }),
      inner: null, workers: 0,
    };
  }
  const evals = new Map();
  for (const r of state.reports) if (r.eval_loss !== null) evals.set(r.version, r.eval_loss);
  const versions = [...evals.keys()].sort((a, b) => a - b);
  state.charts.eval.setData([versions, versions.map((v) => evals.get(v))]);
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

function drawWorkers() {
  const { room } = state;
  const perRound = room.allreduce_bytes_per_step * room.config.inner_steps;
  const rows = room.workers.map((w) => {
    const cells = [w.worker, w.slot, new Date(w.joined * 1000).toLocaleTimeString(),
      w.left === null ? '' : `${new Date(w.left * 1000).toLocaleTimeString()} (${w.why})`,
      w.deltas, fmtBytes(w.bytes), fmtBytes(w.deltas * perRound), w.stale, w.refused];
    const tr = document.createElement('tr');
    tr.dataset.worker = String(w.worker);
    for (const c of cells) {
      const td = document.createElement('td');
      td.textContent = String(c);
      tr.append(td);
    }
    return tr;
  });
  $('workers').tBodies[0].replaceChildren(...rows);
  const sent = room.workers.reduce((a, w) => a + w.bytes, 0);
  const would = room.workers.reduce((a, w) => a + w.deltas * perRound, 0);
  $('traffic').textContent = sent ? `The room sent ${fmtBytes(sent)} of pseudo-gradients; ` +
    `per-step fp32 gradient all-reduce would have sent ${fmtBytes(would)} ` +
    `(${Math.round(would / sent)}x more).` : 'Nothing sent yet.';
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
    publish: async (buf) => {
      const res = await send(routePath('put_room_init', { run_id: runId }),
        { method: 'PUT', body: buf }, [409]);
      return res.status === 409 ? null : res.json();   // 409: another worker published first
    },
    // 409: the round closed without this one (stale), or a retry of one that arrived: either
    // way training goes on. 422 (refused: not finite) is thrown.
    send: (v, buf) => send(routePath('post_room_delta', { run_id: runId, version: v }),
      { method: 'POST', body: buf }, [409]),
    report: (v, losses, evalLoss) => send(routePath('post_room_report', { run_id: runId, version: v }), {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ losses: losses.filter((x) => Number.isFinite(x)),
        eval_loss: Number.isFinite(evalLoss) ? evalLoss : null }) }),
    nextVersion: async (after) => {
      for (;;) {
        const room = await bytes(routePath('get_room', { run_id: runId }))
          .then((b) => JSON.parse(new TextDecoder().decode(b)));
        if (room.version > after || room.finished) return room.version;
        await new Promise((r) => setTimeout(r, POLL_MS));
      }
    },
  };
}

async function join(token) {
  $('join').hidden = true;
  setStatus('Joining the room…');
  const again = heldWorkerToken(runId);   // this tab was a worker before it reloaded
  const res = await fetch(routePath('join_room', { run_id: runId }), { method: 'POST',
    headers: { authorization: `Bearer ${token}`, ...(again ? { 'x-andrea-worker-token': again } : {}) } });
  if (!res.ok) throw new Error(`could not join: ${await responseDetail(res)}`);
  const me = await res.json();
  saveWorkerToken(runId, me.token);
  $('mode').textContent = `(worker ${me.worker} trains here)`;
  const config = state.run.config;
  const ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE),
    onError: (m) => showError(`GPU error: ${m}`), onLost: (m) => showError(m),
    mixed: config.precision === 'mixed' ? 'required' : false });
  const [layout, maps] = await Promise.all([
    fetchRetrying(routePath('get_run_layout', { run_id: runId })).then((r) => r.json()),
    fetchRetrying(routePath('optimizer_maps')).then((r) => r.json()),
  ]);
  setStatus('Compiling kernels and taking the global weights…');
  if (window.andreaGpuOnly && ctx.software) {   // `andrea train --gpu`: never a fallback
    ctx.destroy();
    throw new Error(`the browser offered only a software WebGPU adapter (${ctx.info.vendor} ` +
      `${ctx.info.architecture}), and this worker was asked to train on the GPU`);
  }
  const worker = await RoomWorker.create({
    ctx, layout, config, maps, version: me.version, room: roomNetwork(me),
    loadBatch: (v, step) => fetchRetrying(routePath('room_batch',
      { run_id: runId, version: v, slot: me.slot, step })).then((r) => r.arrayBuffer()),
    loadValBatch: (i) => fetchRetrying(routePath('run_val_batch', { run_id: runId, index: i }))
      .then((r) => r.arrayBuffer()),
    on: {
      status: (status, message) => {
        body.dataset.workerStatus = status;
        setStatus(`worker ${me.worker}: ${status}${message ? `: ${message}` : ''}`,
          status === 'failed' ? 'bad' : 'ok');
      },
      round: () => refresh().catch(() => {}),
    },
  });
  state.worker = worker;
  window.andreaTrainer = worker.trainer;   // `andrea train` reads its stats and stops it
  $('leave').hidden = false;
  $('leave').onclick = () => worker.stop('left the room');
  let end;
  try {
    end = await worker.run();
  } finally {
    worker.destroy();
    if (end !== 'finished') {   // stopped, failed, or thrown: its slot goes to another tab
      await fetch(routePath('leave_room', { run_id: runId }),
        { method: 'DELETE', headers: { authorization: `Bearer ${me.token}` } }).catch(() => {});
    }
  }
  $('leave').hidden = true;
  body.dataset.done = end;
  await refresh();
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
  watch(runId, (msg) => { if (msg.type === 'room' || msg.type === 'run') refresh().catch(() => {}); });
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
    if (!state.room.finished) {
      const start = () => join(token).catch((e) => {
        showError(e.message || String(e));
        body.dataset.done = 'failed';
      });
      $('join').hidden = false;
      $('join').onclick = start;
      if (window.andreaAutoJoin) start();   // `andrea train --join` (server/cli/chromium.py)
    }
  }
  body.dataset.ready = '1';
}

main().catch((e) => {
  showError(e.message || String(e));
  body.dataset.done = 'failed';
});
