// Facts the server owns (server/page_facts.py: the run statuses, the clip modes and their words,
// the optimizer's default hyperparameters, the protocol's storage-budget code and retried
// refusal, mixed precision's Dawn toggles, every route's path by name), rendered into every page
// by templates/base.html as JSON, so no module keeps a copy of its own. Under Node (the page modules' tests) there is no
// page: tests/js/facts.mjs puts the server's facts where this module looks before it loads.
const el = globalThis.document?.getElementById('andrea-facts');
export const FACTS = el ? JSON.parse(el.textContent) : globalThis.andreaFacts;
if (!FACTS) throw new Error('no page facts: load this module from an Andrea page (templates/base.html)');

/** How clip_mode `mode` reads as `kind` ('choice', 'label', 'name'; server/run_config.py
 *  CLIP_MODES); an unknown mode as itself. */
export const clipWords = (mode, kind) => FACTS.clip_modes[mode]?.[kind] ?? mode;

/** The path of route `name` (the server's name for it, page_facts.py route_paths: 'get_run' ->
 *  '/api/runs/{run_id}') with each {param} filled in from `params`, URI-encoded. */
export function routePath(name, params = {}) {
  const template = FACTS.routes[name];
  if (template === undefined) throw new Error(`no route ${name} on this server`);
  return template.replace(/\{(\w+)(?::\w+)?\}/g, (_, key) => {
    if (params[key] === undefined || params[key] === null) throw new Error(`route ${name} needs ${key}`);
    return encodeURIComponent(String(params[key]));
  });
}
