// The new-run page's clipping experiment: three runs of the form's settings, clip_mode global,
// per tensor and off, with the same seed and the source bandit's data (its phase changes shift
// the data, where spikes show). Each run's page opens in a new tab (with its token in the
// fragment: api.js resumeLink) to train it, and this tab goes to the compare page of the three.
// A browser lets one click open one popup or none: the compare page links each run that still
// waits for a training tab (compare_train.js). Each run is named and tagged for its clip mode, so
// the three are told apart (and found together) in the runs list.
import { fetchJson, jsonBody, resumeLink, saveToken, withToken } from './api.js';
import { FACTS, clipWords, routePath } from './facts.js';

export const CLIP_MODES = Object.keys(FACTS.clip_modes);
export const EXPERIMENT_TAG = 'clip-experiment';

/** The three configs: the form's, each with one clip mode, the bandit's data. */
export const experimentConfigs = (base) => CLIP_MODES.map((clip_mode) => (
  { ...base, clip_mode, data_mode: 'bandit' }));

/** A run's name and tags in the experiment: its clip mode's name first (where the list's
 *  names differ; the server's words), then the experiment, its preset and seed (per_tensor:
 *  "... (clip experiment, tiny, seed 7)"; tags clip-experiment, clip-per-tensor). */
export function experimentLabels(config) {
  const shared = ['clip experiment', config.preset, config.seed === undefined ? undefined
    : `seed ${config.seed}`].filter((x) => x !== undefined);
  return {
    name: `${clipWords(config.clip_mode, 'name')} (${shared.join(', ')})`,
    tags: [EXPERIMENT_TAG, `clip-${config.clip_mode.replace('_', '-')}`],
  };
}

/** Makes the three runs (in order: their numbers follow), each named and tagged (PATCH, with
 *  its token) -> [{id, token}]; a refusal throws with the server's reasons (and the runs made
 *  before it, which then expire unstarted). */
async function makeRuns(base, json) {
  const made = [];
  for (const config of experimentConfigs(base)) {
    const run = await json(routePath('create_run'), jsonBody('POST', config));
    saveToken(run.id, run.token);
    await json(routePath('update_run', { run_id: run.id }), withToken(run.id, jsonBody('PATCH', experimentLabels(config))));
    made.push(run);
  }
  return made;
}

/** The button: `config()` is the form's run config, `problems()` what the form refuses,
 *  `fail(text)` shows why nothing started; `json(url, init)` asks the server (the form's own,
 *  which words a refusal in its labels). */
export function bindClipExperiment(button, { config, problems, fail,
  json = (url, init) => fetchJson(url, init, 'config') }) {
  button.addEventListener('click', async () => {
    const refused = problems();
    if (refused.length) {
      fail(`Cannot start: ${refused.join('; ')}`);
      return;
    }
    button.disabled = true;
    let made;
    try {
      made = await makeRuns(config(), json);
    } catch (e) {
      fail(`Cannot start the experiment: ${e.message}`);
      button.disabled = false;
      return;
    }
    for (const run of made) {
      const tab = window.open(resumeLink(location.origin, run.id, run.token), '_blank');
      if (tab) tab.opener = null;
    }
    document.body.dataset.experiment = made.map((r) => r.id).join(',');
    location.href = `${routePath('compare')}?ids=${made.map((r) => r.id).join(',')}`;
  });
}
