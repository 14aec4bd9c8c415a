// A room of W workers (server/room/) driven from Node + Dawn, for a GPU machine with no browser:
// W of the engine's RoomWorkers (engine/room_worker.js, unchanged) in one process on one Dawn
// device, each joined to a live server as a tab is (app/room.js); only the room's network is
// implemented here. Exits 0 once every worker ended finished; non-zero with the reason otherwise.
//
//   node bench/room_node.mjs URL --run ID --join TOKEN --workers 4
//   node bench/room_node.mjs URL --preset 12m --batch 32 --steps 800 --inner 25 --workers 4
//        [--precision fp32|mixed] [--outer lr,momentum] [--devices one|each] [--cut] [--overlap]
//   node bench/room_node.mjs URL --create [the same options]   (makes the room only: its id and
//        join token; one process per worker then joins it with --run ID --join TOKEN --workers 1)
//   node bench/room_node.mjs URL --eval ID [--batches 8] [--version V]   (the mean loss of the
//        room's final global weights, or version V's, on the run's first validation batches)
// The last line of stdout is JSON: {id, version, workers, seconds} or, with --eval, {id, version,
// loss}. Env: DAWN_NODE (Dawn's dawn.node; see bench/gpu/README.md).

import { dawnContext, repo } from './dawn.mjs';

const { RoomWorker } = await import(`${repo}/static/js/engine/room_worker.js`);
const { parseBatch } = await import(`${repo}/static/js/engine/batches.js`);
const { createModel } = await import(`${repo}/static/js/engine/model.js`);

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const url = argv[0]?.replace(/\/$/, '');
if (!url?.startsWith('http')) throw new Error('usage: node bench/room_node.mjs URL ... (see its header)');
const POLL_MS = 200;

async function http(path, init = {}, accept = []) {
  const res = await fetch(url + path, init);
  if (!res.ok && !accept.includes(res.status)) {
    throw new Error(`${init.method ?? 'GET'} ${path}: HTTP ${res.status} ${await res.text()}`);
  }
  return res;
}
const json = async (path, init) => (await http(path, init)).json();
const bytes = async (path) => (await http(path)).arrayBuffer();
const post = (body) => ({ method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify(body) });

/** The room's state, polled every POLL_MS while workers train: nextVersion waits on it, and a
 *  round the room cut (wait_for_slowest off) is seen in it. */
class Watch {
  constructor(id) {
    Object.assign(this, { id, room: null, cut: new Set(), waiters: [], stopped: false });
    this.loop = this.run();
  }

  async run() {
    while (!this.stopped) {
      try {
        this.room = await json(`/api/runs/${this.id}/room`);
        if (this.room.open.cut) this.cut.add(this.room.version);
      } catch (e) {
        console.error(`room poll: ${e.message}`);   // (the next poll tries again)
      }
      for (const w of this.waiters.splice(0)) w();
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  /** The room as polled after now. */
  next() {
    return new Promise((r) => this.waiters.push(() => r(this.room)));
  }
}

/** The room's network for worker `me` (the join's answer), as RoomWorker asks for it. */
function network(id, me, watch) {
  const auth = { authorization: `Bearer ${me.token}` };
  return {
    weights: async (v) => {   // 410: no longer kept (the room moved on)
      const res = await http(`/api/runs/${id}/room/weights/${v}`, {}, [410]);
      return res.status === 410 ? null : res.arrayBuffer();
    },
    update: async (v) => {    // 404: not kept as an update (not the newest, or not int8)
      const res = await http(`/api/runs/${id}/room/updates/${v}`, {}, [404]);
      return res.status === 404 ? null : res.arrayBuffer();
    },
    // 409: the round closed without it, or a repeat: training goes on.
    send: (v, buf, steps) => http(`/api/runs/${id}/room/deltas/${v}?steps=${steps}`,
      { method: 'POST', headers: auth, body: buf }, [409]),
    report: (v, losses, evalLoss, timings) => http(`/api/runs/${id}/room/reports/${v}`, {
      method: 'POST', headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ losses: losses.filter(Number.isFinite),
        eval_loss: Number.isFinite(evalLoss) ? evalLoss : null, timings }) }, [409, 507]),
    cut: (v) => watch.cut.has(v),
    nextVersion: async (after, signal = null) => {
      for (;;) {
        if (signal?.aborted) return null;
        const room = await watch.next();
        if (!room) continue;
        if (room.version > after || room.finished) return room.version;
        const mine = room.workers.find((w) => w.worker === me.worker);
        if (mine && mine.left !== null) throw new Error(`worker ${me.worker} left the room (${mine.why})`);
      }
    },
  };
}

/** A room run as bench/room.py makes one: -> {id, join token}. */
async function createRoom() {
  const W = Number(opt('--workers', 4));
  const [lr, mu] = (opt('--outer', '') || ',').split(',');
  const run = await json('/api/runs', post({
    preset: opt('--preset', '12m'), batch_size: Number(opt('--batch', 32)),
    steps: Number(opt('--steps', 800)), seed: 1, precision: opt('--precision', 'fp32'),
    eval_every: 0, sample_every: 0,
    room: { inner_steps: Number(opt('--inner', 25)), codec: opt('--codec', 'int8'), max_workers: W,
      workers_per_address: W, round_deadline_s: 3600,
      ...(lr ? { outer_lr: Number(lr), outer_momentum: Number(mu) } : {}),
      ...(argv.includes('--cut') ? { wait_for_slowest: false } : {}),
      ...(argv.includes('--overlap') ? { overlap: true } : {}) } }));
  return { id: run.id, join: run.room.join_token };
}

async function trainRoom() {
  const t0 = performance.now();
  const { id, join } = opt('--run') ? { id: opt('--run'), join: opt('--join') } : await createRoom();
  const W = Number(opt('--workers', 4));
  const [run, layout, maps] = await Promise.all([json(`/api/runs/${id}`),
    json(`/api/runs/${id}/layout`), json('/api/optimizer/maps')]);
  const { config } = run;
  const mixed = config.precision === 'mixed';
  // One device for all (one queue, one shader cache), or one each as W tabs have.
  const shared = opt('--devices', 'one') === 'one' ? await dawnContext({ mixed }) : null;
  const watch = new Watch(id);
  const one = async (i) => {
    const res = await http(`/api/runs/${id}/room/workers`,
      { method: 'POST', headers: { authorization: `Bearer ${join}` } });
    const me = await res.json();
    let ctx = shared;
    let end;
    let worker = null;
    try {
      ctx ??= await dawnContext({ mixed });
      worker = await RoomWorker.create({
        ctx, layout, config, maps, version: me.version, room: network(id, me, watch),
        loadBatch: (v, step) => bytes(`/api/runs/${id}/room/batches/${v}/${me.slot}/${step}`),
        loadValBatch: (index) => bytes(`/api/runs/${id}/val_batches/${index}`),
        on: { status: (s, m) => { if (m) console.error(`worker ${me.worker}: ${s}: ${m}`); },
          round: (r) => console.error(`worker ${me.worker} (${i}): version ${r.version} ` +
            `eval ${Number(r.evalLoss).toFixed(4)} last loss ${Number(r.losses.at(-1)).toFixed(4)}`) },
      });
      end = await worker.run();
    } catch (e) {
      end = `failed: ${e.message || e}`;
    } finally {
      worker?.destroy();
      if (!shared) ctx?.destroy();
      if (end !== 'finished') {   // its slot goes to another, as a page's worker leaves
        await http(`/api/runs/${id}/room/workers`,
          { method: 'DELETE', headers: { authorization: `Bearer ${me.token}` } }, [404, 409]).catch(() => {});
      }
    }
    return `worker ${me.worker}: ${end}`;
  };
  const ends = await Promise.all(Array.from({ length: W }, (_, i) => one(i)));
  watch.stopped = true;
  await watch.loop;
  shared?.destroy();
  const room = await json(`/api/runs/${id}/room`);
  const bad = ends.filter((e) => !e.endsWith(': finished'));
  if (bad.length) {
    console.error(`not every worker finished: ${ends.join('; ')}`);
    process.exitCode = 2;
  }
  console.log(JSON.stringify({ id, version: room.version, finished: room.finished, workers: W,
    seconds: (performance.now() - t0) / 1000 }));
}

/** The mean loss of the room's final global weights (or version V's) on its first `--batches`
 *  validation batches: the engine's fp32 model, as bench/room.py's eval page measures it. */
async function evaluate(id) {
  const n = Number(opt('--batches', 8));
  const version = opt('--version') ?? (await json(`/api/runs/${id}/room`)).version;
  const layout = await json(`/api/runs/${id}/layout`);
  const ctx = await dawnContext();
  const model = await createModel(ctx, layout);
  model.setParams(new Float32Array(await bytes(`/api/runs/${id}/room/weights/${version}`)));
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const b = parseBatch(await bytes(`/api/runs/${id}/val_batches/${i}`));
    sum += (await model.lossAndGrads(b.inputs, b.targets, b.B, b.T)).loss;
  }
  model.destroy();
  ctx.destroy();
  console.log(JSON.stringify({ id, version: Number(version), loss: sum / n }));
}

if (opt('--eval')) await evaluate(opt('--eval'));
else if (argv.includes('--create')) console.log(JSON.stringify(await createRoom()));
else await trainRoom();
