"""`andrea generate RUN_ID PROMPT`: a run's model continues a prompt, token by token, on this
machine's CPU (or CUDA GPU) with PyTorch and transformers, as the run page's prompt box does in
the browser. From a running server: the run's newest weights (its final ones, or its newest
checkpoint's; --step K for another), its tokenizer's ids (the server encodes, as for the page)
and its decode table. transformers builds LlamaForCausalLM from the export's config.json
mapping (export.hf_config), so any run generates, toy tasks' alphabets included."""

from __future__ import annotations

import base64
import io
import sys
import urllib.parse

from andrea.cli.http_client import request


class NeedsTorch(RuntimeError):
    """PyTorch or transformers is not installed."""


def _libraries():
    try:
        import torch
        from safetensors.torch import load as load_safetensors
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise NeedsTorch(f"it runs the model with PyTorch and transformers, and {e.name} is not "
                         "installed: pip install torch transformers") from None
    return torch, load_safetensors, LlamaConfig, LlamaForCausalLM


def generate(server: str, run_id: str, prompt: str, tokens: int, temperature: float,
             top_k: int, seed: int, step: int | None = None, out=sys.stdout) -> dict:
    """Writes the continuation to `out` as it comes; -> {ids, probs, step (None: the final
    weights)}: each token's probability under the model (its softmax at temperature 1)."""
    torch, load_safetensors, LlamaConfig, LlamaForCausalLM = _libraries()
    from andrea.export import hf_config
    from andrea.tasks import tokenizer_key

    base = server.rstrip("/")
    rid = urllib.parse.quote(run_id, safe="")
    run = request("GET", f"{base}/api/runs/{rid}")
    if step is None and not run.get("has_weights"):
        step = (run.get("checkpoint") or {}).get("last_step")
        if not step:
            raise ValueError(f"run {run_id} has no weights yet: no checkpoint and no final "
                             "weights")
    key = tokenizer_key(run["config"].get("task"), run["config"]["vocab_size"])
    ids = request("POST", f"{base}/api/tokenizer/{key}/encode", {"text": prompt})["ids"]
    if not ids:
        raise ValueError("the prompt is empty")
    table = [base64.b64decode(b) for b in
             request("GET", f"{base}/api/tokenizer/{key}")["token_bytes_b64"]]
    body = io.BytesIO()
    request("GET", f"{base}/api/runs/{rid}/model.safetensors"
            + (f"?step={step}" if step else ""), into=body, timeout=300)
    model_config = request("GET", f"{base}/api/runs/{rid}/layout")["config"]
    model = LlamaForCausalLM(LlamaConfig.from_dict(hf_config(model_config))).float().eval()
    model.load_state_dict(load_safetensors(body.getvalue()), strict=False)
    model.tie_weights()
    T = model_config["seq_len"]
    gen = torch.Generator().manual_seed(seed)
    pending = b""                   # bytes of a character that continues in the next token
    got, probs = [], []
    with torch.no_grad():
        for _ in range(tokens):
            ctx = torch.tensor([(ids + got)[-T:]])
            logits = model(input_ids=ctx).logits[0, -1].double()
            p = torch.softmax(logits, -1)
            if temperature <= 0:
                nxt = int(logits.argmax())
            else:
                scaled = logits / temperature
                if 0 < top_k < scaled.numel():
                    floor = torch.topk(scaled, top_k).values[-1]
                    scaled = scaled.masked_fill(scaled < floor, float("-inf"))
                nxt = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=gen))
            got.append(nxt)
            probs.append(float(p[nxt]))
            pending += table[nxt] if nxt < len(table) else b""
            text = pending.decode("utf-8", "ignore") if _whole(pending) else ""
            if text:
                out.write(text)
                out.flush()
                pending = b""
    out.write(pending.decode("utf-8", "replace") + "\n")
    return {"ids": got, "probs": probs, "step": step}


def _whole(b: bytes) -> bool:
    """Whether `b` ends on a character's boundary (no UTF-8 sequence cut at its end)."""
    for i in range(1, min(4, len(b)) + 1):
        c = b[-i]
        if c & 0xC0 != 0x80:          # a lead byte (or ASCII): does its sequence fit?
            need = 1 if c < 0x80 else 2 if c >= 0xC0 and c < 0xE0 else 3 if c < 0xF0 else 4
            return i >= need
    return True
