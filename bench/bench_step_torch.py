"""The same training step in PyTorch on the same GPU, for side-by-side figures with
bench/bench_step.mjs: Hugging Face LlamaForCausalLM built from the layout's config, fused AdamW,
clip_grad_norm_(1.0); eager fp32 with TF32 off and on. CUDA events, median of --iters steps.

    PYTHONPATH=. python3 bench/bench_step_torch.py /tmp/l12m.json --batch 32 [--iters 20]

(--seq T overrides the layout's sequence length.)
"""

import argparse
import json

import torch

from bench.cuda_time import median_ms
from tests.reference import hf_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("layout")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    layout = json.load(open(args.layout))["layout"]
    cfg = layout["config"]
    B, T, V = args.batch, args.seq or cfg["seq_len"], cfg["vocab_size"]
    from transformers import LlamaForCausalLM
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: "
          f"{layout.get('preset')} B {B} T {T}")
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.manual_seed(0)
        model = LlamaForCausalLM(hf_config(cfg)).cuda().float()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                weight_decay=0.1, fused=True)
        x = torch.randint(0, V, (B, T), device="cuda")
        y = torch.randint(0, V, (B, T), device="cuda")

        def step(model=model, opt=opt):
            loss = torch.nn.functional.cross_entropy(
                model(input_ids=x).logits.view(-1, V), y.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        ms = median_ms(step, args.iters)
        print(f"  eager fp32{' + TF32' if tf32 else ' (TF32 off)'}: {ms:.2f} ms/step, "
              f"{B * T / ms * 1000:,.0f} tok/s")
        del model, opt


if __name__ == "__main__":
    main()
