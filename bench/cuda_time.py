"""GPU time of a PyTorch callable: CUDA events around each call, median over the calls."""

import statistics

import torch


def median_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `iters` timed calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
