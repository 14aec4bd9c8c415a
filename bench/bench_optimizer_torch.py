"""PyTorch's optimizer phase on the GPU, for bench/bench_optimizer.mjs to print beside the engine:
clip_grad_norm_ + AdamW (fused, and foreach) over one tensor per entry of the parameter table.

    python -m andrea.optim 120m > /tmp/layout_120m.json
    python bench/bench_optimizer_torch.py /tmp/layout_120m.json [--iters 30] [--out torch.json]

Timed with CUDA events, median over --iters steps after warm-up; gradients are restored from a
copy before every step (outside the timing), as in the engine's benchmark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def time_phase(params, grads0, step_fn, iters: int, warm: int = 5) -> float:
    """Median milliseconds of step_fn (CUDA events; wall clock on a CPU smoke run)."""
    cuda = params[0].is_cuda
    times = []
    for i in range(iters + warm):
        for p, g in zip(params, grads0):
            p.grad.copy_(g)
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            step_fn()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            step_fn()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warm:
            times.append(ms)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("layout")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", help="cpu for a smoke run")
    args = ap.parse_args()
    layout = json.load(open(args.layout))["layout"]
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(p["shape"], device=dev, generator=gen) * 0.02)
              for p in layout["params"]]
    grads0 = [torch.randn(p.shape, device=dev, generator=gen) * 2e-3 for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    decay = [q for q, p in zip(params, layout["params"]) if p["decay"]]
    no_decay = [q for q, p in zip(params, layout["params"]) if not p["decay"]]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    n = sum(p.numel() for p in params)
    results = {}
    variants = (("fused", {"fused": True}), ("foreach", {"foreach": dev.type == "cuda"}))
    for name, kw in variants:
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **kw)

        def step(opt=opt):
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()

        ms = time_phase(params, grads0, step, args.iters)
        state = sum(t.numel() * t.element_size() for s in opt.state.values()
                    for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        # the norm reads g, the clip scales g in place (read + write), AdamW reads p, g, m, v and
        # writes p, m, v (torch does not zero g): 40 bytes per parameter
        results[f"{name} AdamW + clip_grad_norm_(foreach)"] = {
            "ms": ms, "gbps": 40 * n / (ms * 1e6), "state_bytes": state}
        del opt
    clip_only = lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)  # noqa: E731
    ms = time_phase(params, grads0, clip_only, args.iters)
    results["clip_grad_norm_(foreach) alone"] = {"ms": ms, "gbps": 4 * n / (ms * 1e6)}
    gpu = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    out = {"gpu": gpu, "torch": torch.__version__, "tensors": len(params), "n_params": n,
           "iters": args.iters, "results": results}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
