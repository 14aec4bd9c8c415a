// The run page's words and controls: name, tags and links; its status and why; the progress
// and figures of the latest record; the setup; text samples; the edit form (name, tags, notes)
// and the actions on a run no tab trains (resume it here, branch it with another learning
// rate), each with the run's token when this tab holds it; the run's resume link to copy. The
// functions that need the page's state take it (run.js).
import { fetchJson, heldToken, jsonBody, resumeLink, saveToken, withToken } from './api.js';
import { clipWords, routePath } from './facts.js';
import { fmtBytes, fmtCount, fmtDuration, fmtTokensPerS, fmtValue } from './format.js';
import { ENDED, EXPLAINED, isTraining, statusLabel, statusNote } from './run_status.js';
import { etaWindow, progress } from './series.js';
import { sampleNode, setShown, shownText } from './text.js';

export const $ = (id) => document.getElementById(id);
const body = document.body;

let progressOf = null;   // the page's state, once showLast has shown its progress

export function setStatus(text, cls = '') {
  $('status').textContent = text;
  $('status').className = `status ${cls}`;
  // A trainer's status comes without a record (paused, stopped, failed): the time left goes now.
  if (progressOf) showProgress(progressOf);
}

export function showError(text) {
  $('error').textContent = text;
  $('error').hidden = false;
}

/** One figure in the stats line (`label`: its words, default the name; `detail`: under the
 *  "Details" toggle instead (true), for internal counters, or in the setup line ('setup')). */
export function stat(name, value, label = name, detail = false) {
  const box = detail === true ? $('details-stats') : detail === 'setup' ? $('setup') : $('stats');
  let el = document.querySelector(`[data-stat="${name}"]`);
  if (!el) {
    el = document.createElement('span');
    el.dataset.stat = name;
    box.append(el);
  }
  el.innerHTML = '';
  el.append(`${label}: `);
  const b = document.createElement('b');
  b.textContent = value;
  el.append(b);
}

/** A sample: its prompt and the model's continuation, marked as the legend in run.html says
 *  (text.js sampleNode). */
export function addSample(step, text) {
  const box = $('samples');
  if (box.querySelector('p')) box.replaceChildren();
  const div = document.createElement('div');
  div.dataset.step = String(step);
  div.append(`step ${step}: `, sampleNode(text));
  box.prepend(div);
}

export function showModelLink() {
  $('model').hidden = false;
}

/** Records (this tab's trainer's, or committed ones from the server) into the series, the
 *  figures, and the charts on the next frame. Watching: a record after the last run message's
 *  step can only come from a trainer, so one holds the run (a tab back after a dropped
 *  connection). */
export function addRecords(state, records) {
  if (state.watching && !state.trainerHere && state.viewed && records.some((r) => r.step > state.stepAtRun)) {
    state.trainerHere = true;
    showViewedStatus(state);
  }
  // The server stamps each committed row with its time; this tab's own records get its clock.
  for (const r of records) state.series.add(r.time === undefined ? { ...r, time: Date.now() / 1000 } : r);
  $('charts').dataset.steps = String(state.series.length);
  showLast(state);
  state.charts?.schedule();
}

/** The run was resumed from its checkpoint at `step`: marked on the charts; a live notice (not
 *  the replayed event) also drops the records after it, which are computed again. */
export function resumedAt(state, step, live) {
  state.charts.resumedAt(step);
  if (live) state.series.truncateAfter(step);
  addRecords(state, []);
}

/** The latest record's numbers and the run's progress (O(1) per record; the clip count is
 *  kept by the charts, the best eval loss by state.evals). */
export function showLast(state) {
  const { series, config } = state;
  const last = series.last;
  if (!last) return;
  const total = config?.steps ?? 0;
  showProgress(state);
  stat('step', `${last.step} / ${total || '?'}`);
  stat('loss', last.loss === null ? 'not finite' : fmtValue(last.loss), 'training loss');
  const ev = state.evals.update(series, series.changedFrom);
  if (ev.last !== null) stat('eval loss', `${fmtValue(ev.last)} (best ${fmtValue(ev.best)})`);
  const pct = (x) => `${(100 * x).toFixed(1)}%`;
  if (ev.acc !== null) stat('accuracy', `${pct(ev.acc)} (best ${pct(ev.bestAcc)})`, 'exact match on held-out problems');
  if (config) stat('tokens seen', fmtCount(last.step * config.batch_size * config.seq_len));
  if (last.tokens_per_s) stat('tokens/s', fmtTokensPerS(last.tokens_per_s), 'speed');
  stat('step time', last.step_ms ? `${last.step_ms.toFixed(1)} ms` : '-');
  stat('grad norm', fmtValue(last.grad_norm), 'gradient norm');
  stat('clip scale', last.clip_scale === null || last.clip_scale === undefined ? '-'
    : last.clip_scale >= 1 ? 'not clipped' : `scaled by ${fmtValue(last.clip_scale, 3)}`,
  'last step');
  stat('lr', fmtValue(last.lr), 'learning rate');
  if (last.loss_scale !== undefined && state.skips) {
    // Mixed precision: the dynamic loss scale, and the steps skipped for a non-finite gradient
    // (each halved the scale; their updates were not applied).
    const { count, steps } = state.skips.update(series, series.changedFrom);
    const shown = steps.slice(-5).join(', ');
    stat('loss scale', `${fmtValue(last.loss_scale)}${count ? ` · ${count} step${count === 1 ? '' : 's'} ` +
      `skipped (${count > 5 ? '… ' : ''}${shown})` : ' · no step skipped'}`, 'mixed precision');
  }
  if (last.opt_ms !== undefined) stat('optimizer (GPU)', `${last.opt_ms.toFixed(2)} ms`, 'optimizer time (GPU)');
  // What the loss kernel saw and the gradients' non-finite elements (trainers that send them).
  if (last.logit_max !== undefined) stat('logit max', fmtValue(last.logit_max), 'largest |logit|');
  if (last.softmax_denom_min !== undefined) {
    stat('softmax denom min', fmtValue(last.softmax_denom_min), 'smallest softmax denominator');
  }
  if (last.grad_nonfinite !== undefined) stat('grad nonfinite', String(last.grad_nonfinite), 'non-finite grad elements');
  // Data seen: B * T tokens a step; passes over the training text (/api/corpus train tokens).
  const corpus = state.trainTokens;
  if (config && corpus) {
    const seen = last.step * config.batch_size * config.seq_len;
    const totalTokens = corpus.reduce((a, s) => a + s.n, 0);
    const least = corpus.reduce((a, s) => (s.n < a.n ? s : a));   // if rows spread evenly
    stat('data', `${(seen / totalTokens).toFixed(2)} passes over the corpus, ` +
      `${(seen / corpus.length / least.n).toFixed(1)} over ${shownText(least.name)}`, 'data read', true);
  }
}

/** The progress bar and its line: done, steps, elapsed, and the time left while a trainer runs
 *  the run (this tab's, or the one a watched run's server message names). */
function showProgress(state) {
  progressOf = state;
  const last = state.series.last;
  if (!last) return;
  const total = state.config?.steps ?? 0;
  const p = progress(state.series, total, etaWindow(state.config));
  $('progress-box').hidden = false;
  $('progress').value = p.fraction;
  const pct = p.fraction < 0.1 ? Math.floor(p.fraction * 1000) / 10 : Math.floor(p.fraction * 100);
  const parts = [`${pct} %`, `step ${last.step} of ${total}`];
  if (p.elapsed !== null) parts.push(`elapsed ${fmtDuration(p.elapsed)}`);
  // No time left unless a trainer is running it: a paused, ended or tab-less run is not
  // getting anywhere. This tab's own trainer is there while it trains.
  const training = isTraining({ status: state.status }, state.watching ? state.trainerHere : true);
  if (p.eta !== null && last.step < total && training) parts.push(`about ${fmtDuration(p.eta)} left`);
  $('progress-text').textContent = parts.join(' · ');
  body.dataset.progress = p.fraction.toFixed(3);
}

/** The run's clipping in words: config.clip_mode (the server maps an older run's `clip`). */
export function clipText(config) {
  const words = clipWords(config.clip_mode, 'label');
  return config.clip_mode === 'off' ? words : `${words}, max_norm ${config.max_norm}`;
}

/** The run as the API or the watch socket says it is (GET /api/runs/{id}, a `run` message). */
export function showRun(state, run) {
  const { runId } = state;
  const config = run.config;
  state.config = config;
  state.run = run;
  state.charts?.setConfig(config);
  if (run.checkpoint?.last_step) {
    stat('last checkpoint', `step ${run.checkpoint.last_step}`, 'last checkpoint', 'setup');
    const a = $('checkpoint-model');
    a.href = `${routePath('get_model', { run_id: runId })}?step=${run.checkpoint.last_step}`;
    a.textContent = `model.safetensors (step ${run.checkpoint.last_step})`;
    a.hidden = false;
  }
  $('resume-run').hidden = !run.can_resume;
  $('branch').hidden = !(run.status === 'failed' && run.checkpoint?.last_step);
  if (!$('branch').hidden) {
    $('branch-step').textContent = String(run.checkpoint.last_step);
    if (!$('branch-lr').value) $('branch-lr').value = String(config.lr / 2);
    $('branch-run').onclick = () => branchHere(state, run);
  }
  if (config.parent) {
    const a = $('parent');
    a.href = routePath('run_page', { run_id: config.parent.run });
    a.textContent = `branched from ${config.parent.run} at step ${config.parent.step}`;
    a.hidden = false;
  }
  state.status = run.status;
  if (state.watching) {
    state.viewed = run;
    state.trainerHere = run.connected;
    state.stepAtRun = run.last_step ?? 0;
    showViewedStatus(state);
  } else {
    // Trained here: an `abandoned` run is being taken by this tab, its message is no news.
    const why = run.message && run.status !== 'abandoned' && EXPLAINED.includes(run.status);
    $('why').textContent = why ? `: ${run.message}` : '';
  }
  if (run.name) {
    setShown($('run-name'), run.name);
    document.title = `${shownText(run.name)} · Andrea`;
    if (!$('edit-name').matches(':focus')) $('edit-name').value = run.name;
  }
  if (run.tags) {
    $('tags').replaceChildren(...run.tags.map((t) => setShown(Object.assign(
      document.createElement('span'), { className: 'tag' }), t)));
    if (!$('edit-tags').matches(':focus')) $('edit-tags').value = run.tags.join(', ');
  }
  if (run.notes !== undefined && !$('edit-notes').matches(':focus')) $('edit-notes').value = run.notes ?? '';
  if (run.has_weights) showModelLink();
  stat('preset', run.model_name ?? config.preset, 'model', 'setup');
  if (!state.trainTokens && !config.task) {
    fetchJson(`${routePath('corpus')}?vocab_size=${config.vocab_size}`).then((c) => {
      // Only the run's sources feed it (config.sources; null: every one).
      state.trainTokens = c.sources.filter((s) => !config.sources || config.sources.includes(s.name))
        .map((s) => ({ name: s.name, n: s.train_tokens }));
    }).catch(() => {});
  }
  if (config.task) stat('sources', `toy task ${config.task}, ${config.task_digits} digits`, 'data', 'setup');
  else stat('sources', config.sources?.join(', ') ?? 'all', 'sources', 'setup');
  stat('optimizer', config.optimizer + (config.f16_mirror ? ' + f16 mirror' : ''), 'optimizer', 'setup');
  stat('optimizer state', fmtBytes(run.state_bytes), 'optimizer state', 'setup');
  stat('clipping', clipText(config), 'clipping', 'setup');
  stat('precision', config.precision === 'mixed'
    ? 'mixed (f16 matmuls on the matrix units, dynamic loss scaling)' : 'fp32', 'precision', 'setup');
  stat('batch', `${config.batch_size} × ${config.seq_len} tokens`, 'batch', 'setup');
  if (run.adapter) {
    stat('adapter', `${run.adapter.vendor} ${run.adapter.architecture}`.trim() +
      (run.adapter.software ? ' (software)' : ''), 'adapter', 'setup');
  }
  body.dataset.status = run.status;
  if ((ENDED.includes(run.status) || run.status === 'abandoned') && !state.series.length) {
    state.charts?.setPlaceholder(run.status === 'abandoned'
      ? 'Never started: no training tab took this run.' : 'No steps were recorded.');
  }
  showLast(state);
}

/** A watched run's state in words (run_status.js): "never started", "no training tab", ... */
function showViewedStatus(state) {
  const run = state.viewed;
  const label = statusLabel(run, state.trainerHere);
  const cls = { 'never started': 'bad', 'no training tab': 'bad', failed: 'bad' }[label] ?? '';
  setStatus(label, cls);
  $('why').textContent = statusNote(run, state.trainerHere);
  $('mode').textContent = run.status === 'abandoned' ? '' : '(watching)';
  body.dataset.shownStatus = label;
  showLast(state);
}

/** The edit form, the resume button, and the resume link when this tab holds the run's token. */
export function bindActions(state) {
  $('edit').addEventListener('submit', (event) => saveEdit(state, event));
  $('edit-save').disabled = false;   // (disabled in the page until now)
  $('resume-run').onclick = () => resumeHere(state);
  $('copy-link').hidden = heldToken(state.runId) === null;
  $('copy-link').onclick = () => copyResumeLink(state);
}

/** The run's resume link (its page with the token in the fragment) to the clipboard, to take
 *  the run to another browser (or `andrea train --resume ID --token ...`). The clipboard
 *  needs a secure page (https or localhost): elsewhere the link is shown to copy by hand. */
async function copyResumeLink(state) {
  const token = heldToken(state.runId);
  if (token === null) return;
  const link = resumeLink(location.origin, state.runId, token);
  try {
    await navigator.clipboard.writeText(link);
    $('copy-link-status').textContent = 'Copied: it holds the run\'s token, share it only with who may change the run.';
  } catch {
    prompt('The run\'s resume link (it holds the run\'s token):', link);
  }
}

/** Name, tags and notes (PATCH /api/runs/{id}, with the run's token when this tab holds it:
 *  a server other machines reach asks for it, see server/routes/runs.py). */
async function saveEdit(state, event) {
  event.preventDefault();
  const tags = $('edit-tags').value.split(',').map((t) => t.trim()).filter(Boolean);
  let out;
  try {
    out = await fetchJson(routePath('update_run', { run_id: state.runId }), withToken(state.runId, jsonBody('PATCH',
      { name: $('edit-name').value, tags, notes: $('edit-notes').value })));
  } catch (e) {
    $('edit-status').textContent = `Not saved: ${e.message}`;
    return;
  }
  $('edit-status').textContent = 'Saved.';
  showRun(state, { ...out, has_weights: undefined });
}

/** Takes the run over in this tab from its last checkpoint (a new write token; the tab that
 *  trained it before, if it comes back, is refused). */
async function resumeHere(state) {
  $('resume-run').disabled = true;
  try {
    const { token } = await fetchJson(routePath('resume_run', { run_id: state.runId }),
      withToken(state.runId, { method: 'POST' }));
    saveToken(state.runId, token);
  } catch (e) {
    showError(`Cannot resume: ${e.message}`);
    $('resume-run').disabled = false;
    return;
  }
  location.reload();
}

/** A failed run continues as a NEW run from its last checkpoint, with another learning rate;
 *  the new run records its parent (run and step). The parent's token authorizes it. */
async function branchHere(state, run) {
  const lr = Number($('branch-lr').value);
  let out;
  try {
    const schema = await fetchJson(routePath('run_config_schema'));   // RunConfig's own fields
    const cfg = Object.fromEntries(Object.entries(run.config)
      .filter(([k]) => k in schema.properties && k !== 'parent'));
    out = await fetchJson(routePath('create_run'), withToken(state.runId, jsonBody('POST',
      { ...cfg, lr, parent: { run: state.runId, step: run.checkpoint.last_step } })));
  } catch (e) {
    showError(`Cannot branch: ${e.message}`);
    return;
  }
  saveToken(out.id, out.token);
  location.href = routePath('run_page', { run_id: out.id });
}
