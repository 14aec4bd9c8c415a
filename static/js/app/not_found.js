// 404 page: the newest runs, in case the link was to one of them.
import { fetchJson } from './api.js';
import { setShown } from './text.js';
import { routePath } from './facts.js';

async function main() {
  const runs = await fetchJson(routePath('list_runs')).catch(() => []);
  const ul = document.querySelector('#recent ul');
  for (const r of runs.slice(0, 5)) {
    const li = document.createElement('li');
    const a = document.createElement('a');
    a.href = routePath('run_page', { run_id: r.id });
    setShown(a, r.name);
    li.append(a, ` (${r.status}, ${new Date(r.created_at * 1000).toLocaleString()})`);
    ul.append(li);
  }
  document.getElementById('recent').hidden = !runs.length;
  document.body.dataset.ready = '1';
}
main();
