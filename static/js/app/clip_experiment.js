// The new-run page's clipping experiment: three runs of the form's settings, clip_mode global,
// per tensor and off, with the same seed and the source bandit's data (its phase changes shift
// the data, where spikes show). Each run's page opens in a new tab (with its token in the
// fragment: api.js resumeLink) to train it, and this tab goes to the compare page of the three.
// A browser lets one click open one popup or none: the compare page links each run that still
// waits for a training tab (compare_train.js).
import { fetchJson, jsonBody, resumeLink, saveToken } from './api.js';

export const CLIP_MODES = ['global', 'per_tensor', 'off'];

/** The three configs: the form's, each with one clip mode, the bandit's data. */
export const experimentConfigs = (base) => CLIP_MODES.map((clip_mode) => (
  { ...base, clip_mode, data_mode: 'bandit' }));

/** Makes the three runs (in order: their numbers follow) -> [{id, token}]; a refusal throws
 *  with the server's reasons (and the runs made before it, which then expire unstarted). */
async function makeRuns(base) {
  const made = [];
  for (const config of experimentConfigs(base)) {
    const run = await fetchJson('/api/runs', jsonBody('POST', config), 'config');
    saveToken(run.id, run.token);
    made.push(run);
  }
  return made;
}

/** The button: `config()` is the form's run config, `problems()` what the form refuses,
 *  `fail(text)` shows why nothing started. */
export function bindClipExperiment(button, { config, problems, fail }) {
  button.addEventListener('click', async () => {
    const refused = problems();
    if (refused.length) {
      fail(`Cannot start: ${refused.join('; ')}`);
      return;
    }
    button.disabled = true;
    let made;
    try {
      made = await makeRuns(config());
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
    location.href = `/compare?ids=${made.map((r) => r.id).join(',')}`;
  });
}
