"""Checkpoints and bit-exact resume through the /lab page (the contract's "Engine API"):
an uninterrupted 8-step run (A) against a run checkpointed every 4 steps (B) and a NEW trainer
resumed from B's checkpoint at step 4 (C). B's records equal A's (checkpoints change nothing),
C's records 5..8 and its final W, optimizer state and f16 mirror equal A's bit for bit; chunk
digests are SHA-256 of the parts; a resume that does not fit is refused and leaks nothing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from andrea.model import PRESETS, build_layout
from andrea.optim import checkpoint_sections
from tests.lab import call

CHUNK = 256 * 1024          # several parts per checkpoint at `tiny` (the last one shorter)
STEPS = 8

SETUP = """
    const {Trainer} = await import('/static/js/engine/trainer.js');
    const {readBuffer} = await import('/static/js/engine/gpu.js');
    const ctx = lab.ctx;
    const layout = await (await fetch('/api/presets/tiny/layout')).json();
    const maps = await (await fetch('/api/optimizer/maps')).json();
    const config = {preset: 'tiny', optimizer: args.optimizer, f16_mirror: args.f16,
      steps: args.steps, batch_size: 2, seq_len: 64, lr: 3e-3, min_lr_ratio: 0.1, warmup_steps: 2,
      beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip_mode: 'global', max_norm: 1.0,
      seed: 0, data_mode: 'uniform', eval_every: 0, sample_every: 0};
    const q = `preset=tiny&batch_size=2&steps=${args.steps}`;
    const loadBatch = (s) => fetch(`/api/batches/${s}?${q}`).then((r) => r.arrayBuffer());
    const u32 = (parts) => parts.map((p) => new Uint32Array(p));
    const join = (parts) => {
      const out = new Uint8Array(parts.reduce((a, p) => a + p.byteLength, 0));
      let at = 0;
      for (const p of parts) { out.set(new Uint8Array(p), at); at += p.byteLength; }
      return out.buffer;
    };
    // A trainer run to the end: its records, the checkpoints it handed over, and its final state.
    async function train({every = null, resume = null} = {}) {
      const records = [], ckpts = [], statuses = [];
      const trainer = await Trainer.create({ctx, layout, config, maps, loadBatch,
        checkpoint: {sections: args.sections, chunk_bytes: args.chunk, every}, resume,
        on: {record: (r) => records.push(r), status: (s) => statuses.push(s),
             checkpoint: (c) => { ckpts.push(c); }}});
      const state = await trainer.run();
      const final = await trainer.checkpoint();
      const mirror = trainer.opt.mirror
        ? new Uint32Array(await readBuffer(ctx.device, trainer.opt.mirror, layout.total_numel * 2))
        : new Uint32Array(0);
      trainer.destroy();
      const f32 = (k) => Float32Array.from(records, (r) => r[k] ?? NaN);
      return {state, statuses, steps: records.map((r) => r.step), loss: f32('loss'),
        grad_norm: f32('grad_norm'), clip_scale: f32('clip_scale'), ckpts, final, mirror,
        stats: trainer.stats};
    }
"""

VARIANTS = [("adamw", False), ("adamw_8bit", False), ("adamw", True)]


def sections(optimizer: str) -> list[dict]:
    return checkpoint_sections(build_layout(PRESETS["tiny"]), optimizer, "fp32")


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def check_parts(parts, digests, total):
    """Parts of CHUNK bytes (the last shorter) whose digests are their SHA-256."""
    sizes = [p.nbytes for p in parts]
    assert sum(sizes) == total and len(parts) == -(-total // CHUNK)
    assert all(s == CHUNK for s in sizes[:-1]) and 0 < sizes[-1] <= CHUNK
    assert digests == [hashlib.sha256(p.tobytes()).hexdigest() for p in parts]


@pytest.mark.parametrize(("optimizer", "f16"), VARIANTS,
                         ids=[o + "_f16" * f for o, f in VARIANTS])
def test_resume_is_bit_exact(lab_session, optimizer, f16):
    secs = sections(optimizer)
    total = sum(s["bytes"] for s in secs)
    out = call(lab_session, SETUP + """
        const before = [ctx.allocatedBytes, ctx.liveBuffers];
        const A = await train({every: 1000});         // uninterrupted: no checkpoint in 8 steps
        const B = await train({every: 4});            // checkpoints at 4 and 8
        const at4 = B.ckpts.find((c) => c.step === 4);
        const C = await train({every: 1000, resume: {step: 4, data: join(at4.parts)}});
        const view = (r) => ({state: r.state, steps: r.steps, loss: r.loss, grad_norm: r.grad_norm,
          clip_scale: r.clip_scale, final: new Uint32Array(join(r.final.parts)),
          final_step: r.final.step, mirror: r.mirror,
          ckpt_steps: r.ckpts.map((c) => c.step), stats: r.stats});
        return {A: view(A), B: view(B), C: view(C), after: [ctx.allocatedBytes, ctx.liveBuffers],
          before, parts4: u32(at4.parts), sha4: at4.chunkSha256, bytes4: at4.bytes,
          readMs: at4.readMs};
    """, {"optimizer": optimizer, "f16": f16, "steps": STEPS, "sections": secs, "chunk": CHUNK})
    A, B, C = out["A"], out["B"], out["C"]
    assert out["after"] == out["before"], "trainers and checkpoints left GPU buffers behind"
    for r in (A, B, C):
        assert r["state"] == "finished" and r["final_step"] == STEPS
    assert A["steps"] == B["steps"] == list(range(1, STEPS + 1))
    # Every 4 steps: at 4, and at 8 (when the one at 4 is still in flight as 8 comes due, it
    # is taken late or at the end; never two at once).
    assert A["ckpt_steps"] == [] and C["ckpt_steps"] == []
    assert B["ckpt_steps"][0] == 4 and B["ckpt_steps"][-1] == 8
    assert B["ckpt_steps"] == sorted(set(B["ckpt_steps"]))
    assert C["steps"] == list(range(5, STEPS + 1)), "the resumed run starts at step 5"
    assert np.isfinite(A["loss"]).all()

    # The checkpoint at 4: the server's sections, in CHUNK parts with their SHA-256.
    assert out["bytes4"] == total
    check_parts(out["parts4"], out["sha4"], total)

    for k in ("loss", "grad_norm", "clip_scale"):
        assert np.array_equal(bits(B[k]), bits(A[k])), f"checkpoints changed {k}"
        assert np.array_equal(bits(C[k]), bits(A[k][4:])), f"resumed {k} differs: " \
            f"{C[k]} vs {A[k][4:]}"
    assert A["final"].nbytes == total
    assert np.array_equal(B["final"], A["final"]), "checkpoints changed the final state"
    w = secs[0]["bytes"] // 4
    assert np.array_equal(C["final"][:w], A["final"][:w]), "resumed final W differs"
    assert np.array_equal(C["final"], A["final"]), "resumed final optimizer state differs"
    assert np.array_equal(C["mirror"], A["mirror"]), "resumed f16 mirror differs"
    if f16:
        assert C["mirror"].size == secs[0]["bytes"] // 8


def test_a_resume_that_does_not_fit_is_refused(lab_session):
    secs = sections("adamw")
    out = call(lab_session, SETUP + """
        const before = [ctx.allocatedBytes, ctx.liveBuffers];
        const total = args.sections.reduce((a, s) => a + s.bytes, 0);
        const tryCreate = async (opts) => {
          try {
            const t = await Trainer.create({ctx, layout, config, maps, loadBatch, ...opts});
            t.destroy();
            return null;
          } catch (e) { return e.message; }
        };
        const ck = (sections) => ({sections, chunk_bytes: args.chunk, every: null});
        return {
          short: await tryCreate({checkpoint: ck(args.sections),
            resume: {step: 4, data: new ArrayBuffer(total - 4)}}),
          long: await tryCreate({checkpoint: ck(args.sections),
            resume: {step: 4, data: new ArrayBuffer(total + 4)}}),
          size: await tryCreate({checkpoint: ck(args.sections.map((s) =>
            s.name === 'V' ? {...s, bytes: s.bytes - 16} : s))}),
          names: await tryCreate({checkpoint: ck(args.eight)}),
          step: await tryCreate({checkpoint: ck(args.sections),
            resume: {step: 99, data: new ArrayBuffer(total)}}),
          fits: await tryCreate({checkpoint: ck(args.sections),
            resume: {step: 4, data: new ArrayBuffer(total)}}),
          after: [ctx.allocatedBytes, ctx.liveBuffers], before, total,
        };
    """, {"optimizer": "adamw", "f16": False, "steps": STEPS, "sections": secs,
          "eight": sections("adamw_8bit"), "chunk": CHUNK})
    total = out["total"]
    assert out["short"] == (f"cannot resume: the checkpoint is {total - 4} bytes, the sections "
                            f"(W, M, V) need {total}")
    assert out["long"].startswith(f"cannot resume: the checkpoint is {total + 4} bytes")
    assert out["size"].startswith("checkpoint sections do not match this engine (V is ")
    assert "the server lists [W 559616 B, M 559616 B, V 559600 B]" in out["size"]
    assert "the engine holds [W 559616 B, M 559616 B, V 559616 B]" in out["size"]
    assert out["names"].startswith('checkpoint sections do not match this engine (no state buffer '
                                   'named "codes")')
    assert out["step"] == "cannot resume at step 99: the run has 8 steps"
    assert out["fits"] is None
    assert out["after"] == out["before"], "a refused trainer left GPU buffers behind"


def test_pause_and_stop_checkpoint(lab_session):
    """After a pause the state is handed over; on stop it is saved (on.checkpoint's promise
    awaited) before the status says stopped; destroy() frees a checkpoint still being read."""
    secs = sections("adamw")
    out = call(lab_session, SETUP + """
        const before = [ctx.allocatedBytes, ctx.liveBuffers];
        const events = [], records = [];
        const trainer = await Trainer.create({ctx, layout, config, maps, loadBatch,
          checkpoint: {sections: args.sections, chunk_bytes: args.chunk, every: 1000},
          on: {record: (r) => records.push(r.step), status: (s) => events.push(s),
               checkpoint: async (c) => {
                 events.push(`checkpoint ${c.step}`);
                 await new Promise((r) => setTimeout(r, 300));    // a slow upload
                 events.push(`saved ${c.step}`);
               }}});
        const done = trainer.run();
        while (records.length < 2) await new Promise((r) => setTimeout(r, 20));
        trainer.pause();
        while (!events.includes('paused')) await new Promise((r) => setTimeout(r, 20));
        const atPause = records.length;
        while (!events.includes(`saved ${atPause}`)) await new Promise((r) => setTimeout(r, 20));
        trainer.resume();
        while (records.length < atPause + 2) await new Promise((r) => setTimeout(r, 20));
        trainer.stop();
        const state = await done;
        const total = records.length;
        // A checkpoint read back while the trainer is destroyed frees its staging too.
        const pending = trainer.checkpoint();
        trainer.destroy();
        const late = await pending.then(() => 'read', (e) => 'aborted');
        return {events, atPause, total, state, late, stats: trainer.stats,
                after: [ctx.allocatedBytes, ctx.liveBuffers], before};
    """, {"optimizer": "adamw", "f16": False, "steps": 200, "sections": secs, "chunk": CHUNK})
    p, n = out["atPause"], out["total"]
    assert out["state"] == "stopped" and n < 200
    assert out["events"] == ["running", "paused", f"checkpoint {p}", f"saved {p}", "running",
                             f"checkpoint {n}", f"saved {n}", "stopped"], out
    assert out["stats"]["checkpoints"] == 2 and out["stats"]["checkpointErrors"] == 0
    assert out["after"] == out["before"], out


def test_every_null_a_checkpoint_each_tenth_of_the_run(lab_session):
    """every === null (checkpoint_cadence.js): one due at each tenth of the run (24 steps: 3, 6,
    ..., 24; the first 20 steps after the start at most), the last at its end; one in flight at
    a time, so one due meanwhile is taken at the first step after it (never two in a tenth)."""
    out = call(lab_session, SETUP + """
        const r = await train();
        return {steps: r.ckpts.map((c) => c.step), ms: r.ckpts.map((c) => c.readMs + c.hashMs),
                state: r.state};
    """, {"optimizer": "adamw", "f16": False, "steps": 24, "sections": sections("adamw"),
          "chunk": CHUNK})
    assert out["state"] == "finished"
    tenth = [s // 3 for s in out["steps"]]                 # 24 steps: a tenth is 3
    assert out["steps"][0] == 3 and out["steps"][-1] == 24, out
    assert tenth == sorted(set(tenth)), out               # never two in one tenth
