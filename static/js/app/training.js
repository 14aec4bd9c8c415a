// Training the run in this tab, the one that holds its write token (api.js): the engine's
// Trainer on this GPU (engine/trainer.js), its records, samples and status to the server over
// the trainer socket (telemetry.js), its checkpoints uploaded as they come, pause, resume and
// stop, and at the end the trained weights uploaded.
import { createContext } from '../engine/context.js';
import { fetchLoader } from '../engine/shaders.js';
import { Trainer } from '../engine/trainer.js';
import { fetchJson, fetchRetrying, responseDetail, retireToken } from './api.js';
import { SHADER_BASE } from './assets.js';
import { mixedMissing } from './mixed_note.js';
import { $, addRecords, addSample, setStatus, showError, showModelLink, stat } from './run_view.js';
import { SocketRefused, TrainerSocket } from './telemetry.js';
import { taskFacts, tokenizerKey } from './task_facts.js';
import { utf8Decoder } from './text.js';
import { routePath } from './facts.js';

const body = document.body;

/** Trains `run` here until it finishes, stops or fails (-> body.dataset.done); throws when it
 *  cannot start (no WebGPU, a GPU too small, a refused checkpoint, a refused trainer socket).
 *  The server refusing the trainer socket for good (a revoked token: the run was resumed
 *  elsewhere; another trainer holds it; bad data) stops the training: nothing more can be
 *  committed or saved with this token, so the page shows the server's reason in #error and
 *  ends `failed` (body.dataset.refused: that reason), without waiting on the socket again. */
export async function train(state, run, token) {
  const { runId, config } = state;
  $('mode').textContent = '(training in this tab)';
  let trainer = null;
  const reach = new ServerReach();
  const socket = new TrainerSocket(runId, token, {
    onState: (s, why) => {
      body.dataset.socket = s;
      // (Closed by this tab at the end: no news.)
      reach.set('records', s === 'disconnected' && !socket.closed
        ? `the trainer socket closed${why ? ` (${why})` : ''}` : null);
      if (s === 'storage') storagePaused(why);
      else if (s === 'connected' && body.dataset.storage) storageResumed();
      if (s !== 'refused') return;
      body.dataset.refused = why;
      showError(refusedText(socket.failed));
      trainer?.stop(`the server refused this tab's trainer socket: ${why}`);
    },
  });
  state.socket = socket;
  const mixed = config.precision === 'mixed';
  const ctx = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE),
    onError: (m) => showError(`GPU error: ${m}`), onLost: (m) => showError(m),
    mixed: mixed ? 'required' : false }).catch(async (e) => {
    // A device with the features that still cannot run the kernel says why.
    if (mixed && e.reason === 'no-mixed') throw new Error(mixedRunMissing(e.message, e.acquired));
    if (!mixed || e.reason !== 'no-device') throw e;
    // The adapter refused the matrix features: a device without them says what adapter it is.
    const plain = await createContext({ gpu: navigator.gpu, load: fetchLoader(SHADER_BASE) })
      .catch(() => null);
    plain?.destroy();
    throw new Error(mixedRunMissing(e.message, plain));
  });
  const { info, software } = ctx;
  // `andrea train --gpu` trains on the GPU or not at all: never on a software fallback.
  if (window.andreaGpuOnly && software) {
    ctx.destroy();
    throw new Error(`the browser offered only a software WebGPU adapter (${info.vendor} ` +
      `${info.architecture}), and this run was asked to train on the GPU`);
  }
  const adapter = { vendor: info.vendor, architecture: info.architecture,
    description: info.description, software };
  stat('adapter', `${info.vendor} ${info.architecture}${software ? ' (software)' : ''}`, 'adapter', 'setup');
  const [layout, maps, tok, task] = await Promise.all([
    fetchJson(routePath('get_run_layout', { run_id: runId })),
    fetchJson(routePath('optimizer_maps')),
    fetchJson(routePath('tokenizer', { key: tokenizerKey(config) })),
    taskFacts(config),
  ]);
  // Retried until the server answers: an outage makes training wait for its batch, not fail.
  const fetchBody = (url) => fetchRetrying(url, {}, { onRetry: (why) => reach.set(url, why) })
    .then((r) => r.arrayBuffer());
  // A resumed (or branched) run continues from its last checkpoint: the state after step K.
  const from = run.checkpoint?.last_step ?? null;
  let resume = null;
  if (from !== null) {
    setStatus(`Loading the checkpoint of step ${from}…`);
    const url = routePath('get_checkpoint', { run_id: runId, step: from });
    const res = await fetchRetrying(url, { headers: { authorization: `Bearer ${token}` } },
      { onRetry: (why) => reach.set(url, why) });   // (a damaged one says so, and waits)
    resume = { step: from, data: await res.arrayBuffer() };
  }
  setStatus(from === null ? 'Compiling kernels and initialising weights…'
    : `Compiling kernels; resuming from step ${from}…`);
  state.charts.setPlaceholder('Compiling kernels: the first step appears here soon…');
  const uploader = new CheckpointUploader(runId, token, socket);
  trainer = await Trainer.create({
    ctx, layout, config, maps, decode: utf8Decoder(tok), checkpoint: run.checkpoint, resume, task,
    loadBatch: (step) => fetchBody(routePath('run_batch', { run_id: runId, step })),
    loadValBatch: (i) => fetchBody(routePath('run_val_batch', { run_id: runId, index: i })),
    on: {
      checkpoint: (ckpt) => uploader.upload(ckpt),
      record: (r) => {
        socket.push(r);
        addRecords(state, [r]);
        state.charts.phaseSeen(r.phase);
      },
      sample: (step, text) => { socket.send({ type: 'sample', step, text }); addSample(step, text); },
      status: (status, message) => {
        body.dataset.status = status;
        state.status = status;
        socket.send({ type: 'status', status, ...(message ? { message } : {}),
          ...(status === 'running' ? { adapter } : {}) });
        setStatus(`${status}${message ? `: ${message}` : ''}`, status === 'failed' ? 'bad' : 'ok');
      },
    },
  });
  if (socket.failed) {   // refused while the trainer was being built: it never starts
    trainer.destroy();
    throw socket.failed;
  }
  window.andreaTrainer = trainer;   // tests and the headless CLI read trainer.stats
  state.trainer = trainer;          // the prompt box asks it between steps
  trainer.stats.uploads = uploader.log;
  $('trainer-controls').hidden = false;
  $('pause').onclick = () => { trainer.pause(); $('pause').hidden = true; $('resume').hidden = false; };
  $('resume').onclick = () => { trainer.resume(); $('pause').hidden = false; $('resume').hidden = true; };
  $('stop').onclick = () => trainer.stop();
  // The weights and optimizer state live only on this tab's GPU: leaving would end the run.
  const stay = (e) => { e.preventDefault(); e.returnValue = ''; };
  window.addEventListener('beforeunload', stay);
  let final;
  try {
    final = await trainer.run();
  } catch (e) {
    showError(`Training failed: ${e.message}`);
    final = 'failed';
  }
  $('trainer-controls').hidden = true;   // nothing left to pause or stop
  // Refused for good: this token can neither commit records nor save weights any more. A lost
  // device has no weights left to read.
  if ((final === 'finished' || final === 'stopped') && !socket.failed && !trainer.lost) {
    await saveWeights(runId, trainer, token, reach);
  }
  state.trainer = null;
  trainer.destroy();   // weights saved (or the run failed): free the GPU memory
  const lastStep = state.series.last?.step ?? 0;
  try {
    await socket.committed(lastStep);
    await socket.sync();
    body.dataset.committed = String(lastStep);
  } catch (e) {
    if (!(e instanceof SocketRefused)) throw e;
    final = 'failed';   // records after the last committed one are lost: the run did not end here
    setStatus(`failed: ${e.reason}`, 'bad');
    body.dataset.status = 'failed';
    showError(refusedText(e));
  }
  window.removeEventListener('beforeunload', stay);   // weights saved, every record committed
  if (trainer.lost && final === 'stopped') deviceLost(trainer, run, lastStep);
  $('mode').textContent = '(trained in this tab)';
  stat('ring waits', `${trainer.stats.ringWaits} (GPU starved ${trainer.stats.gpuStarved})`,
    'readback ring waits', true);
  socket.close();
  retireToken(runId);  // a reload must not train it again (the token still renames, deletes...)
  body.dataset.done = final;
}

/** The device was lost mid-run: the records committed so far stay, the run is `stopped`, and
 *  the resume button continues it from its last checkpoint in a fresh device (`andrea train`
 *  presses it by itself: body.dataset.deviceLost). */
function deviceLost(trainer, run, lastStep) {
  const from = trainer.ckpt.saved ?? run.checkpoint?.last_step ?? null;
  body.dataset.deviceLost = trainer.lost;
  showError(`${trainer.lost}. The records up to step ${lastStep} are kept; ` + (from
    ? `resume to continue from the checkpoint of step ${from}.`
    : 'no checkpoint was saved before the loss, so the run cannot be resumed.'));
  $('resume-run').hidden = !from;
}

/** The page's words for a final refusal of the trainer socket (#error; `andrea train` prints
 *  them as its error line). */
/** The server's storage budget is used up (its data dir at its floor, or this run at its byte
 *  budget; telemetry.js STORAGE_BUDGET): training goes on, its records wait here (none is lost)
 *  and the socket tries again every 30 s. The page says so instead of failing the run. */
function storagePaused(why) {
  body.dataset.storage = why;
  const runFull = /^run_bytes\b/.test(why);
  showError(`Records paused: the server's storage budget is used up — ${runFull
    ? 'this run has stored all it may on this server; ask the operator'
    : 'ask the operator to free space'}. Your unacknowledged records are kept in this tab and ` +
    `sent when the server takes them again (it is asked every 30 s). The server said: ${why}`);
}

function storageResumed() {
  delete body.dataset.storage;
  $('error').hidden = true;
  $('error').textContent = '';
}

function refusedText(refused) {
  return `Training stopped: the server refused this tab's trainer (${refused.reason})`;
}

/** Uploads the trainer's checkpoints (the complete training state) to the server, one at a time.
 *  A failed upload (a full disk, a restarting server) is shown and retried with the next
 *  checkpoint; training goes on meanwhile. */
class CheckpointUploader {
  constructor(runId, token, socket) {
    Object.assign(this, { runId, token, socket });
    this.log = [];   // [{step, mib, readMs, uploadMs}] of the uploads that succeeded
  }

  async upload(ckpt) {
    const t0 = performance.now();
    try {
      // Record K first: a checkpoint of step K is only useful with steps 1..K committed (the
      // server resumes only from such a checkpoint).
      await this.socket.committed(ckpt.step);
      const res = await fetch(routePath('put_checkpoint', { run_id: this.runId, step: ckpt.step }), {
        method: 'PUT', body: new Blob(ckpt.parts),
        headers: { authorization: `Bearer ${this.token}`, 'content-type': 'application/octet-stream',
          'x-andrea-chunk-sha256': ckpt.chunkSha256.join(',') } });
      if (!res.ok) throw new Error(`${res.status} ${await responseDetail(res)}`);
      const ms = performance.now() - t0;
      this.log.push({ step: ckpt.step, mib: ckpt.bytes / 2 ** 20, readMs: ckpt.readMs, uploadMs: ms });
      stat('checkpoint', `step ${ckpt.step} (${(ckpt.bytes / 2 ** 20).toFixed(1)} MiB, ` +
        `read ${ckpt.readMs.toFixed(0)} ms, upload ${ms.toFixed(0)} ms)`);
      body.dataset.checkpoint = String(ckpt.step);
      $('checkpoint-error').hidden = true;
    } catch (e) {
      if (this.socket.failed) throw e;   // the page says why (#error): no retry is coming
      $('checkpoint-error').textContent = `Checkpoint of step ${ckpt.step} not saved ` +
        `(${e.message}); training goes on and the next checkpoint tries again.`;
      $('checkpoint-error').hidden = false;
      throw e;   // the trainer counts it as not saved (a stop checkpoint is then tried again)
    }
  }
}

/** "Server unreachable" on the page while anything of the training tab cannot reach the server
 *  (a batch, the trainer socket, the weights upload), and since when: training waits for its
 *  batches and keeps every record the server has not stored; nothing is lost, nothing fails.
 *  body.dataset.unreachable is set meanwhile (the e2e tests read it). */
class ServerReach {
  constructor() {
    this.failing = new Map();   // what -> why it cannot reach the server now
    this.since = null;
  }

  set(what, why) {
    if (why) this.failing.set(what, why);
    else this.failing.delete(what);
    const el = $('unreachable');
    if (!this.failing.size) {
      this.since = null;
      el.hidden = true;
      delete body.dataset.unreachable;
      return;
    }
    this.since ??= new Date();
    const reasons = [...new Set(this.failing.values())].join('; ');
    el.textContent = `Server unreachable since ${this.since.toLocaleTimeString()}, retrying ` +
      `(${reasons}). Training waits for its next batch; every record the server has not ` +
      'stored is kept in this tab and sent when it is back.';
    el.hidden = false;
    body.dataset.unreachable = String(this.failing.size);
  }
}

/** Upload the trained weights (W, table order) so the run can be exported to PyTorch. */
async function saveWeights(runId, trainer, token, reach) {
  try {
    const w = await trainer.model.getParams();
    // A Blob, not the array itself: Chrome's renderer crashes sending an ArrayBuffer body of
    // hundreds of MB (120m: 478 MB), and streams a Blob (sent again whole by a retry).
    await fetchRetrying(routePath('put_weights', { run_id: runId }), { method: 'PUT', body: new Blob([w]),
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' } },
    { onRetry: (why) => reach.set('weights', why) });
    showModelLink();
    body.dataset.weights = 'saved';
  } catch (e) {
    showError(`Could not save the trained weights: ${e.message}`);
  }
}

/** Why a mixed-precision run cannot train here (mixed_note.js), as the run's error. */
function mixedRunMissing(why, ctx = null) {
  return 'this run trains in mixed precision, which needs f16 subgroup matrices (WGSL\'s matrix ' +
    `units), and ${mixedMissing(why, ctx, 'train with precision fp32 (a new run)')}`;
}
