// The compare page's "open to train" links: runs made in this tab (the clipping experiment on the
// new-run page makes three and comes here) that no training tab holds yet. Each link is the
// run's page with its token in the fragment (api.js resumeLink), so the new tab trains it
// whatever it inherits; a blocked popup of the new-run page is then one click away.
import { resumeLink, savedToken } from './api.js';
import { isolated } from './text.js';

/** A run that has never had a trainer: created, or expired before its first step. */
const waiting = (run) => !run.connected && (run.status === 'created'
  || (run.status === 'abandoned' && run.last_step === null && !run.checkpoint?.last_step));

/** The links in `box`, for the found runs that wait for a training tab this tab can give. */
export function showTrainLinks(box, found) {
  const links = found.filter((r) => waiting(r.run) && savedToken(r.id) !== null).map((r) => {
    const a = document.createElement('a');
    a.href = resumeLink(location.origin, r.id, savedToken(r.id));
    a.target = '_blank';
    a.dataset.runId = r.id;
    a.append('open ', isolated(r.run.name), ' to train');
    return a;
  });
  if (!links.length) {
    box.replaceChildren();
    return;
  }
  box.replaceChildren('No training tab holds these runs yet (a browser may block the tabs a page ' +
    'opens): ', ...links.flatMap((a, i) => (i ? [' · ', a] : [a])));
}
