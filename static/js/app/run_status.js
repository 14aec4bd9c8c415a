// What a run's state is, in the words the runs list and the run page show. The stored status is
// what the trainer last reported; whether a training tab holds the run now (the API's
// `connected`, server/runs/info.py) decides whether a `running` run is really running. No DOM:
// tests/js/run_status.test.mjs runs it under Node.

import { FACTS } from './facts.js';

// The server's lists (server/runs/info.py RunStatus, ENDED, EXPLAINED, as page_facts.py serves
// them). Every status a run can have:
export const RUN_STATUSES = FACTS.statuses.all;
/** Where training has ended, for now: no trainer is at the run, so no time is left to count. */
export const ENDED = FACTS.statuses.ended;
/** The statuses whose `message` says why the run is there. */
export const EXPLAINED = FACTS.statuses.explained;

/** The words for a run's state (`connected`: a training tab holds it now):
 *  - `abandoned`: "never started" (no training tab came within the server's grace period);
 *  - `running` or `paused` without a trainer: "no training tab" (closed, reloaded or crashed;
 *    the server marks it interrupted after its own grace period);
 *  - `created`: "starting" with a trainer, else "waiting for a training tab";
 *  - anything else: the status itself. */
export function statusLabel(run, connected = run.connected) {
  const s = run.status;
  if (s === 'abandoned') return 'never started';
  if ((s === 'running' || s === 'paused') && connected === false) return 'no training tab';
  if (s === 'created') return connected ? 'starting' : 'waiting for a training tab';
  return s;
}

/** Whether a trainer is at the run now, so its progress may show the time left. */
export function isTraining(run, connected = run.connected) {
  return run.status === 'running' && connected !== false;
}

/** Why the run is where it is, for the run page (empty when there is nothing to add). */
export function statusNote(run, connected = run.connected) {
  const label = statusLabel(run, connected);
  if (label === 'no training tab') {
    return run.can_resume
      ? ': the tab that trained it is gone (closed, reloaded or crashed); it can go on from its last checkpoint'
      : ': the tab that trained it is gone (closed, reloaded or crashed) before its first checkpoint';
  }
  if (run.message && EXPLAINED.includes(run.status)) {
    return `: ${run.message}`;
  }
  return '';
}
