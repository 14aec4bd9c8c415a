"""The README.md of an exported checkpoint: a Hugging Face model card that says what was trained
(the model, its parameter count and shape), how far (steps, tokens, the last and the best
losses), how (optimizer, schedule, seed) and on what (the corpus's sources and their sizes), and
how to use it. A pure function of the run, the summary of its metrics (`summary`: four facts, so
a run of 1M records is never read whole: the store computes the same by query, card_summary) and
the corpus's meta.json, with no clock or path in it (export.py writes it beside the weights).
"""

from __future__ import annotations

import json
from pathlib import Path

from andrea import tasks
from andrea.data.tokenizer import EOT, EOT_ID
from andrea.data.tokens import tokens_dir
from andrea.run_config import CLIP_MODES, StoredRunConfig, model_name, run_model


def corpus_meta(data_dir: Path, run: dict) -> dict | None:
    """The run's token files' meta.json (source names and sizes): no tokenizing, just a read."""
    cfg = run["config"]
    path = tokens_dir(data_dir, cfg.corpus_hash, run_model(cfg).vocab_size)
    try:
        return json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def summary(metrics: list[dict]) -> dict:
    """Steps done, the last train loss, the last and the best eval loss (with their steps)."""
    losses = [(m["step"], m["loss"]) for m in metrics if m.get("loss") is not None]
    evals = [(m["step"], m["eval_loss"]) for m in metrics if m.get("eval_loss") is not None]
    return {"steps": max((m["step"] for m in metrics), default=0),
            "loss": losses[-1] if losses else None,
            "eval": evals[-1] if evals else None,
            "best_eval": min(evals, key=lambda e: e[1]) if evals else None}


def _loss(pair: tuple[int, float] | None) -> str:
    return "not recorded" if pair is None else f"{pair[1]:.4f} (step {pair[0]:,})"


def optimizer_text(cfg: StoredRunConfig) -> str:
    state = ("8-bit AdamW (block-wise quantized moments, bitsandbytes-style)"
             if cfg.optimizer == "adamw_8bit" else "AdamW (fp32 moments)")
    mirror = ", matmuls on an f16 mirror of the f32 weights" if cfg.f16_mirror else ""
    if cfg.precision == "mixed":
        mirror += (", mixed precision (matmuls with f16 operands and f32 accumulation on the "
                   "GPU's matrix units, dynamic loss scaling)")
    clip = CLIP_MODES[cfg.clip_mode]["card"].format(norm=cfg.max_norm)
    return (f"{state}{mirror}; betas ({cfg.beta1:g}, {cfg.beta2:g}), eps {cfg.eps:g}, "
            f"weight decay {cfg.weight_decay:g}{clip}")


def schedule_text(cfg: StoredRunConfig) -> str:
    w = cfg.warmup_steps
    warmup = f"linear warmup over {w:,} step{'s' * (w != 1)}, then " if w else ""
    return (f"peak {cfg.lr:g}, {warmup}cosine decay to {cfg.lr * cfg.min_lr_ratio:g} "
            f"at step {cfg.steps:,}")


DATA_MODES = {
    "uniform": "each batch row from a source picked with equal probability",
    "bandit": "sources mixed by a bandit that favours the sources whose loss still falls",
}


TASK_WORDS = {
    "copy": "copy {n} digits", "reverse": "reverse {n} digits", "sort": "sort {n} digits",
    "add": "add two {n}-digit numbers", "mod": "add two numbers modulo 97",
}


def task_text(cfg: StoredRunConfig) -> str:
    """A toy task run's data (andrea.tasks): its problems, its held-out ones."""
    prompt, answer = tasks.example(cfg.task, cfg.task_digits)
    held = ("half of the 97 x 97 pairs, chosen by the seed" if cfg.task == "mod"
            else "a tenth of the prompts, by hash")
    return (f"The toy task `{cfg.task}`: {TASK_WORDS[cfg.task].format(n=cfg.task_digits)}"
            f", problems such as `{prompt}{answer}` each ended by a newline, made from the run's "
            f"seed, one problem per row. Held out, never trained on: {held}; the eval measures "
            "the loss and the exact match (every answer token right) on them.")


def data_text(cfg: StoredRunConfig, corpus: dict | None) -> str:
    if cfg.task:
        return task_text(cfg)
    mode = cfg.data_mode
    lines = [f"Corpus `{cfg.corpus_hash}`, data mode `{mode}` "
             f"({DATA_MODES.get(mode, mode)}); the last {_val_pct(corpus)} of each source is "
             f"held out for the eval loss. Each document is followed by `{EOT}` in the token "
             "stream.", ""]
    picked = cfg.sources          # the run's sources (None: every one of the corpus)
    if picked:
        names = [s["name"] for s in corpus["sources"]] if corpus else picked
        others = [n for n in names if n not in picked]
        lines[0] += (f" Trained and evaluated on {len(picked)} of the corpus's sources only: "
                     f"{', '.join(picked)}" + (f" (not {', '.join(others)}; the tokenizer is "
                                               "the whole corpus's)." if others else "."))
    if corpus is None:
        return "\n".join(lines + ["(The source list is not cached in the exporting data dir.)"])
    lines += ["| source | documents | characters | tokens |", "|---|---:|---:|---:|"]
    lines += [f"| {s['name']} | {s['n_documents']:,} | {s['n_chars']:,} | {s['n_tokens']:,} |"
              for s in corpus["sources"] if not picked or s["name"] in picked]
    return "\n".join(lines)


def _val_pct(corpus: dict | None) -> str:
    return f"{corpus['val_fraction']:.0%}" if corpus else "part"


FRONT_MATTER = """---
library_name: transformers
pipeline_tag: text-generation
tags:
- andrea
- llama
- webgpu
- from-scratch
---
"""

def usage(cfg: StoredRunConfig) -> str:
    """How to use the folder: a corpus run's continues text, a task run's answers a problem."""
    if not cfg.task:
        return USAGE
    prompt, _ = tasks.example(cfg.task, cfg.task_digits)
    return f"""## Use

```python
from transformers import pipeline

answer = pipeline("text-generation", model="path/to/this/folder")
print(answer("{prompt}", do_sample=False)[0]["generated_text"])
```

Generation stops at the newline that ends an answer (token 0); the tokenizer has one token per
character of the task's alphabet.
"""


USAGE = f"""## Use

```python
from transformers import pipeline

generate = pipeline("text-generation", model="path/to/this/folder")
print(generate("def main():")[0]["generated_text"])
```

Generation stops at `{EOT}` (the end of a document) or at the context length trained on
(`max_length` in generation_config.json); the tokenizer adds no BOS token, as in training.
"""


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def model_rows(layout: dict, cfg: StoredRunConfig) -> list[tuple[str, str]]:
    m = layout["config"]
    return [
        ("architecture", "LlamaForCausalLM: RMSNorm, RoPE, SwiGLU, tied input/output embeddings"),
        ("parameters", f"{layout['n_params']:,}"),
        ("layers, heads, width, FFN",
         f"{m['n_layer']}, {m['n_head']}, {m['n_embd']}, {m['ffn_dim']}"),
        ("vocabulary", f"{m['vocab_size']} tokens: one per character of "
                       f"`{tasks.ALPHABET[1:]}` and the newline (id 0) that ends a problem"
         if cfg.task else f"{m['vocab_size']:,} byte-level BPE tokens; `{EOT}` (id "
                                 f"{EOT_ID}) ends a document"),
        ("context", f"trained on {cfg.seq_len:,}-token windows (positions up to "
                    f"{m['seq_len']:,})"),
    ]


def training_rows(run: dict, s: dict, step: int | None = None) -> list[tuple[str, str]]:
    """`s`: summary() of the records up to `step` (store.Metrics.card_summary)."""
    cfg = run["config"]
    tokens = s["steps"] * cfg.batch_size * cfg.seq_len
    status = run.get("status") or "unknown"
    return [
        ("status", status if step is None else f"the checkpoint of step {step:,} (run {status})"),
        ("steps", f"{s['steps']:,} of {cfg.steps:,}"),
        ("batch", f"{cfg.batch_size} x {cfg.seq_len} tokens"),
        ("tokens seen", f"{tokens:,} (steps x batch size x context)"),
        ("final train loss", _loss(s["loss"])),
        ("final eval loss", _loss(s["eval"])),
        ("best eval loss", _loss(s["best_eval"])),
        ("optimizer", optimizer_text(cfg)),
        ("learning rate", schedule_text(cfg)),
        ("seed", str(cfg.seed)),
    ]


def model_card(run: dict, layout: dict, records: dict, corpus: dict | None,
               step: int | None = None) -> str:
    """`records`: summary() of the run's records up to `step` (store.Metrics.card_summary)."""
    cfg = run["config"]
    made_with = f"andrea export {run['id']}" + (f" --step {step}" if step else "") + " --out DIR"
    return "\n".join([
        FRONT_MATTER,
        f"# Andrea run {run['id']}", "",
        f"A small Llama-style causal language model (`{model_name(cfg)}`) trained from "
        "scratch in a web browser with WebGPU by Andrea, exported as a Hugging Face checkpoint.",
        "", "## Model", "", _table(model_rows(layout, cfg)), "",
        "## Training", "", _table(training_rows(run, records, step)), "",
        "Losses are mean token cross-entropy in nats.", "",
        "## Data", "", data_text(cfg, corpus), "",
        usage(cfg),
        "## Made with", "", "```", made_with, "```", "",
    ])
