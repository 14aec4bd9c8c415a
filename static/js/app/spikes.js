// The run page's spike list: GET /api/runs/{id}/spikes (server/spikes.py says what a spike is),
// drawn as one <details> per spike, newest first; opening one shows its anatomy: why it counts,
// the data phase boundary it follows, and the batch rows furthest above the step's loss with
// their source and text, and where the server has them the tensors, layer, non-finite elements
// and numerical flags of the step (spike_anatomy.js). Refreshed every REFRESH_MS while the run
// may still change; opening a spike moves the charts to its step.
// No DOM at import (tests/js/spikes.test.mjs runs spikeTally under Node).
import { fetchJson } from './api.js';
import { anatomyParts, topTensorText } from './spike_anatomy.js';
import { setShown, shownText } from './text.js';
import { routePath } from './facts.js';
import { ENDED } from './run_status.js';

const REFRESH_MS = 10_000;
const $ = (id) => document.getElementById(id);

/** How many spikes, in words, for a run whose status is `status`: a finished run's are all it
 *  will have ("2 in all.", "No spikes in this run."); any other's may still grow ("2 so far.",
 *  "No spikes yet.": a stopped, interrupted or failed run may be resumed). -> {count, empty}:
 *  the rule's last sentence, and the list's text when there are none. */
export function spikeTally(count, status) {
  const all = status === 'finished';
  return { count: `${count} ${all ? 'in all' : 'so far'}.`,
    empty: all ? 'No spikes in this run.' : 'No spikes yet.' };
}

/** Shows the run's spikes now and every REFRESH_MS until `status()` (the run's status now) is
 *  one that ends it; the list fetched after that is the last, and it is counted as the run's
 *  whole (spikeTally). `onSteps(steps)` gets the spikes' steps each time (the grad norm chart
 *  marks them), and `onOpen(step)` a spike's step when it is opened. */
export function followSpikes(runId, status, onSteps = () => {}, onOpen = () => {}) {
  $('spikes').addEventListener('toggle', (event) => {
    const d = event.target;
    if (d.open && d.dataset.step && !d.dataset.restored) onOpen(Number(d.dataset.step));
    delete d.dataset.restored;
  }, true);   // (toggle does not bubble)
  const tick = async () => {
    // The status before the fetch: a run that ended since the last tick gets one more fetch,
    // counted as its whole, and then no more.
    const now = status();
    try {
      const found = await fetchJson(routePath('get_spikes', { run_id: runId }));
      showSpikes(found, now);
      onSteps(found.spikes.map((s) => s.step));
    } catch (e) {
      $('spikes-rule').textContent = `Spikes unavailable: ${e.message}`;
    }
    if (!ENDED.includes(now)) setTimeout(tick, REFRESH_MS);
  };
  tick();
}

function showSpikes({ rule, spikes }, status) {
  const tally = spikeTally(spikes.length, status);
  // Each entry's ratio is against the same median as the rule's, so an entry flagged for a clip
  // or a non-finite element (below the factor) says so instead of contradicting the header.
  $('spikes-rule').textContent = `A spike: a grad norm at least ${rule.factor}x the median grad ` +
    `norm of the ${rule.window} steps before it (fewer early in a run), a clip after ` +
    `${rule.quiet} steps without one, or a non-finite norm or gradient element. Each entry says ` +
    `which, and its grad norm as a multiple of that median. ${tally.count}`;
  const box = $('spikes');
  box.dataset.count = String(spikes.length);
  if (!spikes.length) {
    box.replaceChildren(Object.assign(document.createElement('p'), { textContent: tally.empty }));
    return;
  }
  const open = new Set([...box.querySelectorAll('details[open]')].map((d) => d.dataset.step));
  box.replaceChildren(...[...spikes].reverse().map((s) => spikeItem(s, open.has(String(s.step)))));
}

/** Why a spike counts and its grad norm against the running median, in one line: a spike by
 *  ratio leads with its ratio; any other leads with its reason, its ratio after it. */
function spikeWhy(s) {
  const others = s.reasons.filter((_, i) => s.kinds[i] !== 'ratio');
  const norm = s.grad_norm === null ? null : `grad norm ${s.grad_norm.toPrecision(3)}`;
  const against = s.ratio === null ? ''
    : `, ${s.ratio.toFixed(1)}x the median of the ${s.level_steps} steps before`;
  if (s.kinds.includes('ratio')) return `${norm}${against}${others.length ? `; also ${others.join('; ')}` : ''}`;
  return others.join('; ') + (norm === null ? '' : ` (${norm}${against})`);
}

function spikeItem(s, open) {
  const d = document.createElement('details');
  d.className = 'spike';
  d.dataset.step = String(s.step);
  d.open = open;
  if (open) d.dataset.restored = '1';     // open again after a refresh: not the user's click
  const sum = document.createElement('summary');
  sum.textContent = `step ${s.step}: ${spikeWhy(s)}${topTensorText(s)}` +
    (s.boundary ? `, ${s.boundary.steps_after} step(s) after a data phase change` : '');
  d.append(sum, line(s.reasons.join('; ')));
  if (s.boundary) {
    const moved = (s.boundary.weights ?? []).map((w) =>
      `${w.source} ${w.before.toFixed(2)} -> ${w.after.toFixed(2)}`);
    d.append(line(`data phase ${s.boundary.previous} -> ${s.boundary.phase}, ` +
      `${s.boundary.steps_after} step(s) before this one` +
      (moved.length ? `; sampling weights ${moved.join(', ')}` : '')));
  }
  const clip = s.clip_scale === null ? 'non-finite' : Number(s.clip_scale.toPrecision(3));
  if (s.loss !== null) d.append(line(`step loss ${s.loss.toFixed(4)}, clip scale ${clip}`));
  d.append(...anatomyParts(s));
  for (const r of s.rows) {
    const row = document.createElement('div');
    row.className = 'spike-row';
    const loss = r.loss === null ? 'non-finite' : r.loss.toFixed(3);
    row.append(line(`row ${r.row}: loss ${loss}` +
      (r.excess === null ? '' : ` (${r.excess >= 0 ? '+' : ''}${r.excess.toFixed(3)})`) +
      (r.source ? ` from ${shownText(r.source)}` : '')));
    if (r.text) {
      const pre = document.createElement('pre');
      pre.className = 'samples';
      setShown(pre, r.text);
      row.append(pre);
    }
    d.append(row);
  }
  return d;
}

function line(text) {
  return Object.assign(document.createElement('p'), { textContent: text });
}
