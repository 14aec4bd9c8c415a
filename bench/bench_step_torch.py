"""The same training step in PyTorch on the same GPU, for side-by-side figures with the engine
(bench_step.mjs, bench_trainer.mjs, the app): Hugging Face LlamaForCausalLM built from the
layout's config, fused AdamW, clip_grad_norm_(1.0), CUDA events, median of --iters steps.

The rows are what a PyTorch user runs, each with HF's default attention (SDPA): fp32 with TF32
off, fp32 with TF32, bf16 autocast (TF32 on, as a user of autocast leaves it), and
torch.compile of the model under bf16 autocast. Last, labelled as the extra it is: eager
attention (the parity tests' reference, tests/reference.py) in fp32 with TF32 off.

    PYTHONPATH=. python3 bench/bench_step_torch.py /tmp/l12m.json --batch 32 [--iters 20]
    [--no-compile]

(--seq T overrides the layout's sequence length.)
"""

import argparse
import contextlib
import json

import torch

from bench.cuda_time import median_ms
from tests.reference import hf_config

# (label, attention, TF32, bf16 autocast, torch.compile): the headline first (the speed table
# and current_table.py read "fp32 (TF32 off)"), the parity tests' eager attention last.
MODES = (
    ("fp32 (TF32 off)", "sdpa", False, False, False),
    ("fp32 + TF32", "sdpa", True, False, False),
    ("bf16 autocast", "sdpa", True, True, False),
    ("torch.compile + bf16 autocast", "sdpa", True, True, True),
    ("extra: eager attention, fp32 (TF32 off)", "eager", False, False, False),
)


def step_fn(cfg: dict, B: int, T: int, attention: str, autocast: bool, compiled: bool,
            device: str = "cuda"):
    from transformers import LlamaForCausalLM
    V = cfg["vocab_size"]
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_config(cfg, attention)).to(device).float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    forward = torch.compile(model) if compiled else model
    x = torch.randint(0, V, (B, T), device=device)
    y = torch.randint(0, V, (B, T), device=device)

    def step():
        ctx = (torch.autocast(device, dtype=torch.bfloat16) if autocast
               else contextlib.nullcontext())
        with ctx:
            logits = forward(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("layout")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile row")
    args = ap.parse_args()
    layout = json.load(open(args.layout))["layout"]
    cfg = layout["config"]
    B, T = args.batch, args.seq or cfg["seq_len"]
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: "
          f"{layout.get('preset')} B {B} T {T}")
    for label, attention, tf32, autocast, compiled in MODES:
        if compiled and args.no_compile:
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        step = step_fn(cfg, B, T, attention, autocast, compiled)
        # torch.compile compiles at the first calls: more untimed ones before timing.
        ms = median_ms(step, args.iters, warmup=8 if compiled else 3)
        print(f"  {label}: {ms:.2f} ms/step, {B * T / ms * 1000:,.0f} tok/s")
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
