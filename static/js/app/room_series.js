// "Did the room help?" (room.js's chart): the room's global eval loss, each worker's own
// training loss and the lone tab's (the newest single run that trains what one worker trains:
// server/room/lone.py) on one x axis, the tokens each worker trained, i.e. one participant's
// own compute. No DOM: tests/js/room_series.test.mjs runs it under Node.
import { fmtCount, fmtValue } from './format.js';

export const TOKENS_AXIS = 'tokens each worker trained';

/** Tokens of one step of a run of `config`: its batch x its context. */
export const tokensPerStep = (config) => config.batch_size * config.seq_len;

/** Global version v has had v x H steps of each worker: its tokens. */
export const versionTokens = (v, H, config) => v * H * tokensPerStep(config);

/**
 * The chart's series and columns. room: GET /api/runs/{id}/room (evals, config.inner_steps);
 * reports: GET .../room/reports' (each worker's inner losses of a version); config: the room
 * run's config (batch_size, seq_len); lone: null, or {id, config, records} (the single run's
 * records: step, loss, eval_loss).
 * -> {series: [{key, label, worker?}], cols: [xs, ...one per series], counts, compare}: the
 * global eval loss (the workers' median per version, at v x H x B x T), each worker that
 * reported, thin (its inner step s of version v at (v x H + s + 1) x B x T), then the lone
 * tab's eval and training loss (step n at n x its B x its T). counts: versions, workers,
 * loneEvals, loneSteps. compare: compareAt's.
 */
export function helpedSeries(room, reports, config, lone = null) {
  const H = room.config.inner_steps;
  const per = tokensPerStep(config);
  const series = [];
  const points = [];          // per series: Map x -> y
  const add = (spec, map) => { series.push(spec); points.push(map); };

  const global = new Map();
  for (const e of room.evals) if (e.median !== null && e.median !== undefined) global.set(versionTokens(e.version, H, config), e.median);
  add({ key: 'global', label: 'room: global eval loss (median of the workers)' }, global);

  const byWorker = new Map();
  for (const r of reports) {
    if (!r.losses?.length) continue;
    if (!byWorker.has(r.worker)) byWorker.set(r.worker, new Map());
    const m = byWorker.get(r.worker);
    r.losses.forEach((loss, i) => {
      if (Number.isFinite(loss)) m.set((r.version * H + i + 1) * per, loss);
    });
  }
  for (const w of [...byWorker.keys()].sort((a, b) => a - b)) {
    add({ key: `worker ${w}`, label: `worker ${w}: training loss`, worker: w }, byWorker.get(w));
  }

  const loneEval = new Map();
  const loneTrain = new Map();
  if (lone) {
    const lonePer = tokensPerStep(lone.config);
    for (const rec of lone.records) {
      const x = rec.step * lonePer;
      if (Number.isFinite(rec.eval_loss)) loneEval.set(x, rec.eval_loss);
      if (Number.isFinite(rec.loss)) loneTrain.set(x, rec.loss);
    }
    add({ key: 'lone eval', label: 'one tab alone: eval loss' }, loneEval);
    add({ key: 'lone train', label: 'one tab alone: training loss' }, loneTrain);
  }

  const xs = [...new Set(points.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  const cols = [xs, ...points.map((m) => xs.map((x) => m.get(x) ?? null))];
  return {
    series, cols,
    counts: { versions: global.size, workers: byWorker.size, loneEvals: loneEval.size,
      loneSteps: loneTrain.size },
    compare: lone ? compareAt(global, loneEval) : null,
  };
}

/** The room's global eval loss beside the lone tab's: at the most tokens where both have one
 *  (same: true), else the room's latest beside the lone tab's nearest to it in tokens
 *  (same: false). room, lone: Map tokens -> eval loss. -> {room: [x, loss], lone: [x, loss],
 *  same}, or null while either has none. */
export function compareAt(room, lone) {
  if (!room.size || !lone.size) return null;
  const common = [...room.keys()].filter((x) => lone.has(x));
  if (common.length) {
    const x = Math.max(...common);
    return { room: [x, room.get(x)], lone: [x, lone.get(x)], same: true };
  }
  const x = Math.max(...room.keys());
  const near = [...lone.keys()].sort((a, b) => Math.abs(a - x) - Math.abs(b - x) || a - b)[0];
  return { room: [x, room.get(x)], lone: [near, lone.get(near)], same: false };
}

/** The answer in words (the lone tab's name is the page's to show, as user text). shaped:
 *  helpedSeries'; lone: whether there is a lone tab on this server. */
export function helpedText(shaped, lone) {
  if (!lone) {
    return 'No single run on this server trains what one of the room\'s workers trains (the ' +
      'same model, batch, context, optimizer and lr): train one tab alone to see whether the ' +
      'room beats it for the same compute per participant.';
  }
  const c = shaped.compare;
  if (!c) {
    if (!shaped.counts.versions) return 'The room has no global eval loss yet.';
    return 'One tab alone has no eval loss yet.';
  }
  const [rx, rl] = c.room;
  const [lx, ll] = c.lone;
  if (!c.same) {
    return `The room's global eval loss is ${fmtValue(rl)} at ${fmtCount(rx)} tokens each ` +
      `worker trained; one tab alone's is ${fmtValue(ll)} at ${fmtCount(lx)} tokens.`;
  }
  const d = rl - ll;
  const verdict = Math.abs(d) < 5e-5 ? 'the same'
    : d < 0 ? `the room is ${fmtValue(-d)} lower: it helped`
      : `the room is ${fmtValue(d)} higher: it has not helped (yet)`;
  return `At ${fmtCount(rx)} tokens each worker trained, the room's global eval loss is ` +
    `${fmtValue(rl)} and one tab alone's ${fmtValue(ll)}: ${verdict}.`;
}
