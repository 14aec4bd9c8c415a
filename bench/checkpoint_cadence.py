"""How much work a crash would lose with the automatic checkpoint interval (issue 36; the bound
by steps came later), and what the checkpoints cost. The rule (nextAutoCheckpoint in
static/js/engine/checkpoint_cadence.js): one due at each tenth of the run's steps, and at most
RISK_MS (2 min) of training after the last (ckptMs / MAX_SHARE for a checkpoint dearer than 10%
of that), no sooner than a minute and COST_FACTOR x the read back (~2%) within those bounds.
Two ways to measure:

--model (no server, no browser): the trainer's own CheckpointCadence, run under Node on a
simulated clock with the step, read-back and upload times measured on a GPU and on SwiftShader
(FIGURES, from bench/results/checkpoint_cadence.txt), one checkpoint in flight at a time as in
the trainer. Per run: the steps checkpointed, the largest gap between two (or the last and the
run's end), the most a crash could lose (steps run since the last checkpoint whose upload had
completed, the run's end included), the read back's and the upload's share of training time;
and the same for the cadence before the bound by steps (a minute apart / 50 x the read back, at
most the larger of 50 steps and 2 min).

live (`andrea serve`, then `andrea train` with --checkpoint-every left empty, as a user runs it):
per run, the steps checkpointed, the training between them (steps and seconds, from the stored
records' commit times), the largest of those beside the rule's interval at the run's median step
and read-back time, and each checkpoint's read back and upload in the browser. Figures, not a
verdict.

    .venv/bin/python -m bench.checkpoint_cadence --model              # the runs in MODEL_RUNS
    .venv/bin/python -m bench.checkpoint_cadence --model --run 120m:200 --run tiny:2000
    .venv/bin/python -m bench.checkpoint_cadence --run tiny:8:200       # SwiftShader
    python3 -m bench.checkpoint_cadence --gpu --run 12m:32:5000 --run 120m:8:700   # a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CADENCE = ROOT / "static/js/engine/checkpoint_cadence.js"

# Measured with the cadence before the bound by steps (bench/results/checkpoint_cadence.txt,
# 2026-12-04): the record step median, each checkpoint's read back and upload (medians).
FIGURES = {
    "12m": {"where": "H200, 12m batch 32", "stepMs": 27.3, "readMs": 521, "uploadMs": 813},
    "120m": {"where": "H200, 120m batch 8", "stepMs": 202.9, "readMs": 3938, "uploadMs": 6669},
    "tiny": {"where": "SwiftShader, tiny batch 8", "stepMs": 2871.6, "readMs": 10638,
             "uploadMs": 280},
}
# The runs measured live, each also at 200 steps, and long ones (12m: 7.6 h, 120m: 5.6 h,
# tiny: 96 min).
MODEL_RUNS = ["12m:200", "120m:200", "tiny:200", "12m:5000", "120m:700", "tiny:2000",
              "12m:1000000", "120m:100000"]

# Drives the engine's CheckpointCadence on a simulated clock (tests/js/checkpoint_cadence.test.mjs
# does the same): a snapshot resolves readMs after it is taken, its upload uploadMs after that.
# rule 'before': the same object, its next step reset by the cadence before the bound by steps.
SIMULATE = r"""
import { CheckpointCadence } from %(cadence)s;
const before = (ckptMs, stepMs) => {   // checkpoint.js nextCheckpointInterval, as it was
  if (!(stepMs > 0) || !Number.isFinite(ckptMs)) return 20;
  const cost = Math.max(1, Math.ceil((50 * ckptMs) / stepMs), Math.ceil(60_000 / stepMs));
  return Math.min(cost, Math.max(50, Math.ceil(120_000 / stepMs)));
};
async function simulate({ runSteps, stepMs, readMs, uploadMs, rule }) {
  let now = 0, done = 0, saved = 0, atRisk = 0, uploadSum = 0;
  const events = [], steps = [];
  const later = (ms, value) =>
    new Promise((r) => events.push({ at: now + ms, fire: () => r(value) }));
  const flush = () => new Promise((r) => setImmediate(r));
  const fire = async () => {
    events.sort((a, b) => a.at - b.at);
    const e = events.shift();
    now = Math.max(now, e.at);
    e.fire();
    await flush();
  };
  const cad = new CheckpointCadence({ sections: [], chunk_bytes: 4, every: null }, {
    device: null, done: () => done, sections: () => [], recordOf: async () => {},
    isBad: () => false, stats: { checkpoints: 0, checkpointErrors: 0 }, runSteps: () => runSteps,
    deliver: async (ck) => {
      if (rule === 'before') cad.next = ck.step + before(readMs, stepMs);
      await later(uploadMs);
      uploadSum += uploadMs;
      atRisk = Math.max(atRisk, Math.min(runSteps, Math.floor(now / stepMs)) - saved);
      saved = ck.step;
    } });
  cad.snapshot = () => {
    steps.push(done);
    return later(readMs, { step: done, readMs, hashMs: 0 });
  };
  cad.start(0, false);
  if (rule === 'before') { cad.next = 20; cad.first = null; }
  for (let s = 1; s <= runSteps; s++) {
    const t = now + stepMs;
    while (events.length && Math.min(...events.map((e) => e.at)) <= t) await fire();
    now = t;
    done = s;
    cad.recordStepMs(stepMs);
    cad.maybe();
  }
  let ended = false;
  const end = cad.ifDue().then(() => { ended = true; });
  while (!ended) { if (events.length) await fire(); else await flush(); }
  await end;
  atRisk = Math.max(atRisk, runSteps - saved);
  const gaps = [...steps, runSteps].map((s, i) => s - (steps[i - 1] ?? 0));   // the end too
  const trainMs = runSteps * stepMs;
  return { steps, maxGap: Math.max(...gaps), atRisk, readShare: steps.length * readMs / trainMs,
    uploadShare: uploadSum / trainMs };
}
const out = [];
for (const run of %(runs)s) {
  out.push({ ...run, now: await simulate({ ...run, rule: 'now' }),
    before: await simulate({ ...run, rule: 'before' }) });
}
console.log(JSON.stringify(out));
"""

INTERVAL = """
import { nextAutoCheckpoint } from %(cadence)s;
console.log(JSON.stringify(%(runs)s.map(({ runSteps, stepMs, ckptMs }) => ({
  tenth: Math.ceil(runSteps / 10),
  time: nextAutoCheckpoint(0, { runSteps: Infinity, stepMs, ckptMs }) })));
"""


def node(script: str, **values) -> object:
    """Runs a Node module (values inserted as JSON) and returns its JSON output."""
    code = script % {k: json.dumps(v) for k, v in
                     {"cadence": CADENCE.as_uri(), **values}.items()}
    r = subprocess.run(["node", "--input-type=module", "-e", code], capture_output=True,
                       text=True, timeout=1800)
    if r.returncode:
        raise SystemExit(f"node failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def short(steps: list[int], n: int = 10) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= n else \
        ", ".join(map(str, steps[:n])) + f", ... {steps[-1]}"


def model(specs: list[str]) -> None:
    runs = []
    for spec in specs:
        preset, steps = spec.split(":")
        runs.append({"preset": preset, "runSteps": int(steps), **FIGURES[preset]})
    print("model: the engine's CheckpointCadence under Node on a simulated clock, one checkpoint "
          "in flight at a time;\nat risk = the most a crash loses (steps since the last "
          "checkpoint uploaded); shares of training time")
    for r in node(SIMULATE, runs=runs):
        ms = r["stepMs"]
        print(f"\n{r['preset']} {r['runSteps']} steps ({r['where']}: step {ms} ms, read back "
              f"{r['readMs'] / 1000:g} s, upload {r['uploadMs'] / 1000:g} s; "
              f"{r['runSteps'] * ms / 1000:,.0f} s of training)")
        for name in ("now", "before"):
            c = r[name]
            n = len(c["steps"])
            print(f"  {name:>6}: {n:>3} checkpoint{'s' * (n != 1)}: {short(c['steps'])}")
            print(f"          largest gap {c['maxGap']} steps ({c['maxGap'] * ms / 1000:.1f} s; "
                  "the end included), "
                  f"at risk {c['atRisk']} steps ({c['atRisk'] * ms / 1000:.1f} s); read back "
                  f"{100 * c['readShare']:.1f}%, upload {100 * c['uploadShare']:.1f}%")


def train(url: str, preset: str, batch: int, steps: int, gpu: bool) -> dict:
    cmd = [sys.executable, "-m", "andrea", "train", *(["--gpu"] if gpu else []), "--server", url,
           "--preset", preset, "--batch-size", str(batch), "--steps", str(steps), "--json"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if not result.get("ok"):
        raise SystemExit(f"andrea train failed ({preset}): {result.get('error')}\n"
                         f"{r.stderr[-2000:]}")
    result["wall_s"] = time.monotonic() - t0
    return result


def live(specs: list[str], gpu: bool) -> None:
    import httpx

    from andrea.cli.launch import served

    print("rule: one due at each tenth of the run, at most 2 min of training after the last "
          "(static/js/engine/checkpoint_cadence.js); every step after the last is at risk until "
          "the run ends")
    with tempfile.TemporaryDirectory() as tmp, served(Path(tmp)) as url:
        for spec in specs:
            preset, batch, steps = spec.split(":")
            result = train(url, preset, int(batch), int(steps), gpu)
            records = httpx.get(f"{url}/api/runs/{result['run_id']}/metrics",
                                timeout=120).json()
            at = {m["step"]: m["time"] for m in records}
            uploads = result["readback"]["uploads"]
            # Step 0 has no record: the training before the first checkpoint counts from the
            # first record's commit.
            marks = [0] + [u["step"] for u in uploads]
            start = at[min(at)]
            med = statistics.median(m["step_ms"] for m in records if m.get("step_ms"))
            read = statistics.median(u["readMs"] for u in uploads) if uploads else float("nan")
            print(f"\n{preset} batch {batch}, {steps} steps: {result['wall_s']:.0f} s, "
                  f"record step median {med:.1f} ms, {len(uploads)} checkpoints")
            print(f"  {'step':>6} {'since last':>11} {'s of training':>14} {'read ms':>9} "
                  f"{'upload ms':>10}")
            worst_steps = worst_s = 0.0
            for prev, u in zip(marks, uploads):     # (marks: one more, the run's end aside)
                gap = u["step"] - prev
                secs = at[u["step"]] - at.get(prev, start)
                worst_steps, worst_s = max(worst_steps, gap), max(worst_s, secs)
                print(f"  {u['step']:>6} {gap:>11} {secs:>14.1f} {u['readMs']:>9.0f} "
                      f"{u['uploadMs']:>10.0f}")
            tail = int(steps) - marks[-1]
            tail_s = at[int(steps)] - at.get(marks[-1], start)
            print(f"  after the last: {tail} steps, {tail_s:.1f} s (the run's end)")
            [rule] = node(INTERVAL, runs=[{"runSteps": int(steps), "stepMs": med,
                                           "ckptMs": read}])
            print(f"  largest gap: {worst_steps:.0f} steps, {worst_s:.1f} s; the rule here: a "
                  f"tenth of the run {rule['tenth']} steps, by time and cost {rule['time']} "
                  f"steps (median step and read back)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append",
                    help="live: PRESET:BATCH:STEPS; --model: PRESET:STEPS (PRESET in FIGURES)")
    ap.add_argument("--model", action="store_true",
                    help="the cadence under Node from recorded figures (no server, no browser)")
    ap.add_argument("--gpu", action="store_true", help="andrea train --gpu")
    args = ap.parse_args()
    if args.model:
        model(args.run or MODEL_RUNS)
    elif not args.run:
        ap.error("--run PRESET:BATCH:STEPS (or --model)")
    else:
        live(args.run, args.gpu)


if __name__ == "__main__":
    main()
