// Compare page: the chosen runs' loss and grad-norm curves overlaid, with a summary table.
import { Chart, smooth } from './charts.js';

const ids = (new URLSearchParams(location.search).get('ids') || '').split(',').filter(Boolean);
const tbody = document.querySelector('#summary tbody');

function median(xs) {
  const s = xs.filter((x) => x !== null && x !== undefined).sort((a, b) => a - b);
  return s.length ? s[s.length >> 1] : null;
}

/** A run's recorded losses (non-finite steps are stored as null). */
const finiteLosses = (metrics) => metrics.map((m) => m.loss)
  .filter((x) => x !== null && x !== undefined);

/** Mean training loss over a run's last 10 recorded steps (null if none). */
function tailMean(losses) {
  const l = losses.slice(-10);
  return l.length ? l.reduce((a, b) => a + b, 0) / l.length : null;
}

async function main() {
  const runs = await Promise.all(ids.map(async (id) => {
    const [run, metrics] = await Promise.all([
      fetch(`/api/runs/${id}`).then((r) => (r.ok ? r.json() : null)),
      fetch(`/api/runs/${id}/metrics`).then((r) => (r.ok ? r.json() : [])),
    ]);
    return { id, run, metrics };
  }));
  const found = runs.filter((r) => r.run);
  const ref = found.length ? tailMean(finiteLosses(found[0].metrics)) : null;   // gap reference
  const gap = (losses, isRef) => {
    if (isRef) return 'reference';
    const tail = tailMean(losses);
    if (tail === null || !ref) return '-';
    const pct = (tail / ref - 1) * 100;
    return `${pct >= 0 ? '+' : ''}${pct.toFixed(2)} %`;
  };
  for (const { id, run, metrics } of runs) {
    const tr = tbody.insertRow();
    tr.dataset.runId = id;
    if (!run) { tr.insertCell().textContent = `${id}: no such run`; continue; }
    const losses = finiteLosses(metrics);
    const a = document.createElement('a');
    a.href = `/runs/${id}`;
    a.textContent = id;
    tr.insertCell().append(a);
    tr.insertCell().textContent = run.config.optimizer + (run.config.f16_mirror ? ' + f16' : '');
    tr.insertCell().textContent = String(metrics.length);
    const ck = run.checkpoint?.last_step;
    tr.insertCell().textContent = ck ? `step ${ck}${run.can_resume ? ' · resumable' : ''}` : '-';
    tr.insertCell().textContent = losses.length ? losses[losses.length - 1].toFixed(4) : '-';
    tr.insertCell().textContent = losses.length ? Math.min(...losses).toFixed(4) : '-';
    tr.insertCell().textContent = `${(run.state_bytes / 2 ** 20).toFixed(2)} MiB`;
    const ms = median(metrics.map((m) => m.step_ms));
    tr.insertCell().textContent = ms === null ? '-' : `${ms.toFixed(1)} ms`;
    const opt = median(metrics.map((m) => m.opt_ms));   // GPU time, where timestamp-query exists
    tr.insertCell().textContent = opt === null ? '-' : `${opt.toFixed(2)} ms`;
    tr.insertCell().textContent = gap(losses, run === found[0].run);
  }
  // One x axis over the union of steps; each run a series with gaps where it has no step.
  const steps = [...new Set(found.flatMap((r) => r.metrics.map((m) => m.step)))].sort((a, b) => a - b);
  const at = (r, key) => {
    const by = new Map(r.metrics.map((m) => [m.step, m[key]]));
    return steps.map((s) => by.get(s) ?? null);
  };
  const label = (r) => `${r.id} ${r.run.config.optimizer}`;
  const parent = document.getElementById('charts');
  const loss = new Chart(parent, 'loss', found.map((r) => ({ label: label(r) })));
  const norm = new Chart(parent, 'grad norm', found.map((r) => ({ label: label(r) })));
  const draw = () => {
    const alpha = Number(document.getElementById('smoothing').value);
    loss.update([steps, ...found.map((r) => smooth(at(r, 'loss'), alpha))]);
    norm.update([steps, ...found.map((r) => smooth(at(r, 'grad_norm'), alpha))]);
  };
  document.getElementById('smoothing').addEventListener('input', draw);
  draw();
  parent.dataset.series = String(found.length);
  document.body.dataset.ready = '1';
}

main();
