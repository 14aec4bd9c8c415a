// Run page. The tab that created the run (its token is in sessionStorage: api.js) trains it on
// this GPU and streams records to the server (training.js); any other tab watches the committed
// records live. The page's state is the one object below; run_view.js shows it, run_charts.js
// charts it.
import { fetchJson, savedToken, takeLinkToken } from './api.js';
import { RUN_COLUMNS, RunCharts } from './run_charts.js';
import { $, addRecords, addSample, bindActions, resumedAt, setStatus, showError, showRun } from './run_view.js';
import { RunSeries, evalLosses, skippedSteps } from './series.js';
import { bindPromptBox, promptDefaults } from './prompt_box.js';
import { bindAttention } from './attention_view.js';
import { ModelSource } from './model_source.js';
import { followSpikes } from './spikes.js';
import { watch } from './telemetry.js';
import { train } from './training.js';
import { routePath } from './facts.js';

const body = document.body;

const state = {
  runId: $('run').dataset.runId,
  config: null,          // the run's config
  status: null,          // the run's status, as last heard (the server, or this tab's trainer)
  // Watching (not training here): whether a training tab holds the run now. The server says so
  // with each run message (`connected`); a record committed after that message's last step can
  // only come from a trainer, so it says so too (a tab back after a dropped connection).
  watching: false,
  viewed: null,          // watching: the run as the last run message had it
  trainerHere: null,
  stepAtRun: 0,          // that message's last step
  trainTokens: null,     // the run's corpus: [{name, n: training tokens}] (GET /api/corpus)
  // Columnar metrics by step (series.js): records may arrive twice (backlog + live) or out of
  // order.
  series: new RunSeries(RUN_COLUMNS),
  evals: evalLosses(),   // the last and the best eval loss (O(1) per row)
  skips: skippedSteps(), // mixed precision's skipped steps
  charts: null,          // RunCharts
  socket: null,          // this tab's TrainerSocket, while it trains the run
};

/** Follows the run's committed records, status and samples over the watch socket. */
function view() {
  watch(state.runId, (msg) => {
    if (msg.type === 'records') {
      addRecords(state, msg.records);
      state.charts.phaseSeen(msg.records[msg.records.length - 1]?.phase);
    } else if (msg.type === 'run') showRun(state, msg.run);
    else if (msg.type === 'deleted') {
      setStatus('This run was deleted.', 'bad');
      body.dataset.status = 'deleted';
    }
    else if (msg.type === 'sample') addSample(msg.step, msg.text);
    else if (msg.type === 'resumed') resumedAt(state, msg.step, msg.kind === undefined);
  }, (s) => { body.dataset.socket = s; });
}

async function main() {
  const { runId } = state;
  takeLinkToken(runId);   // opened from a resume link: the token kept, the fragment dropped
  const res = await fetch(routePath('get_run', { run_id: runId }));
  if (!res.ok) {
    setStatus(`No run ${runId} here.`, 'bad');
    body.dataset.status = 'missing';
    return;
  }
  const run = await res.json();
  const token = savedToken(runId);
  // A run made in this tab that expired to `abandoned` before it started may still train here.
  const mine = token !== null && (run.status === 'created'
    || (run.status === 'abandoned' && run.last_step === null && !run.checkpoint?.last_step));
  state.watching = !mine;
  state.charts = new RunCharts(runId, state.series,
    mine ? 'Starting: the first step appears here…' : 'Waiting for the first step…');
  showRun(state, run);
  bindActions(state);
  const source = new ModelSource(state);   // the prompt box's and the attention maps' model
  bindPromptBox(state, source);
  bindAttention(state, source);
  promptDefaults(run.config).catch(() => {});
  followSpikes(runId, () => state.status, (steps) => state.charts.setSpikes(steps),
    (step) => state.charts.focusStep(step));
  if (run.config.data_mode === 'bandit') state.charts.loadSources().catch(() => {});
  if (!mine) {
    view();
    return;
  }
  if (run.checkpoint?.last_step) {   // a resumed run: the steps before its checkpoint
    addRecords(state, await fetchJson(routePath('get_metrics', { run_id: runId })));
    resumedAt(state, run.checkpoint.last_step, false);
  }
  try {
    await train(state, run, token);
  } catch (e) {
    showError(`Cannot train here: ${e.message}`);
    // Before its first step (no WebGPU, a GPU too small): the server sees no training tab,
    // so the run reads "never started" (or, resumed, interrupted) and another tab may take it.
    state.socket?.close();
    body.dataset.done = 'failed';
    throw e;
  }
}

main();
