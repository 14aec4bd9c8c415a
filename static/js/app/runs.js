// Runs list: status, optimizer, steps, last loss; pick runs to compare.
const tbody = document.querySelector('#runs tbody');
const button = document.getElementById('compare');

function cell(tr, content) {
  const td = tr.insertCell();
  if (content instanceof Node) td.append(content);
  else td.textContent = content;
  return td;
}

function link(href, text) {
  const a = document.createElement('a');
  a.href = href;
  a.textContent = text;
  return a;
}

async function main() {
  const runs = await (await fetch('/api/runs')).json();
  for (const r of runs) {
    const tr = tbody.insertRow();
    tr.dataset.runId = r.id;
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.value = r.id;
    cell(tr, box);
    cell(tr, link(`/runs/${r.id}`, r.id));
    cell(tr, r.status).title = r.message ?? '';       // why it failed, stopped or was interrupted
    const ck = r.checkpoint?.last_step;
    cell(tr, ck ? `step ${ck}${r.can_resume ? ' · resumable' : ''}` : '-');
    cell(tr, r.config.preset);
    cell(tr, r.config.optimizer + (r.config.f16_mirror ? ' + f16' : ''));
    cell(tr, r.config.clip ? String(r.config.max_norm) : 'off');
    cell(tr, `${r.last_step ?? 0} / ${r.config.steps}`);
    cell(tr, r.last_loss === null || r.last_loss === undefined ? '-' : r.last_loss.toFixed(4));
    cell(tr, `${(r.state_bytes / 2 ** 20).toFixed(2)} MiB`);
    cell(tr, new Date(r.created_at * 1000).toLocaleString());
    const ex = document.createElement('span');
    ex.append(link(`/api/runs/${r.id}/metrics?format=csv`, 'csv'), ' ',
      link(`/api/runs/${r.id}/metrics`, 'json'));
    cell(tr, ex);
  }
  if (!runs.length) {
    cell(tbody.insertRow(), 'No runs yet: start one from New run.').colSpan = 12;
  }
  tbody.addEventListener('change', () => {
    button.disabled = tbody.querySelectorAll('input:checked').length < 2;
  });
  button.addEventListener('click', () => {
    const ids = [...tbody.querySelectorAll('input:checked')].map((b) => b.value);
    location.href = `/compare?ids=${ids.join(',')}`;
  });
  document.body.dataset.ready = '1';
}

main();
