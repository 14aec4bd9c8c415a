"""Trained weights: the training tab uploads W (f32, table offsets) when a run ends; export turns
them into a complete Hugging Face checkpoint that `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load as it is (the table's names are HF's names):

  config.json              LlamaConfig (the keys transformers 5 writes, plus `andrea_run`)
  generation_config.json   stop at <|endoftext|>, at most the run's context
  model.safetensors        the weights, f32
  tokenizer.json           the run's byte-level BPE, byte for byte as it trained
  tokenizer_config.json    eos/bos/pad/unk = <|endoftext|>, no automatic BOS, model_max_length
  special_tokens_map.json  the same special tokens, for older loaders
  README.md                a model card: what was trained, on what, how far

Everything is a pure function of the run, its metrics and the files in the data dir, with no
clock or path in it: the same run exported twice, or through a server, gives the same bytes.
transformers is not imported here (it is no runtime dependency): the JSON is written as
transformers 5.24 writes it itself (tests/test_export.py loads the result with it).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np

from andrea.data.tokenizer import EOT, tokenizer_dir
from andrea.data.tokens import tokens_dir
from andrea.model import model_name, run_layout, run_model

EOT_ID = 0            # <|endoftext|>: the trainer's only special token, so always id 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)   # zip entries carry no clock: the archive is deterministic


def weights_path(data_dir: Path, run_id: str) -> Path:
    return data_dir / "runs" / run_id / "weights.f32"


def tokenizer_path(data_dir: Path, run: dict) -> Path | None:
    """The tokenizer the run trained with (cached under the run's own corpus hash), if built."""
    vocab = run_model(run["config"]).vocab_size
    path = tokenizer_dir(data_dir, run["config"].get("corpus_hash", ""), vocab) / "tokenizer.json"
    return path if path.exists() else None


def hf_config(config: dict) -> dict:
    """config.json for LlamaForCausalLM, from the model config of the parameter table.
    No pad_token_id: LlamaModel makes it the embedding's padding_idx, whose row then gets no
    gradient when fine-tuning, and <|endoftext|> is a trained token (generation_config.json and
    the tokenizer carry the pad id instead)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config["vocab_size"], "hidden_size": config["n_embd"],
        "intermediate_size": config["ffn_dim"], "num_hidden_layers": config["n_layer"],
        "num_attention_heads": config["n_head"], "num_key_value_heads": config["n_head"],
        "head_dim": config["head_dim"], "max_position_embeddings": config["seq_len"],
        "rms_norm_eps": config["norm_eps"],
        # rope_parameters is the transformers 5 key; rope_theta is what 4.x reads.
        "rope_parameters": {"rope_theta": config["rope_theta"], "rope_type": "default"},
        "rope_theta": config["rope_theta"],
        "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "dtype": "float32",
        "bos_token_id": EOT_ID, "eos_token_id": EOT_ID,
    }


def generation_config(seq_len: int) -> dict:
    # Greedy by default; generate() stops at <|endoftext|>, the end of a document in training.
    return {"bos_token_id": EOT_ID, "eos_token_id": EOT_ID, "pad_token_id": EOT_ID,
            "max_length": seq_len}


def tokenizer_config(seq_len: int) -> dict:
    """GPT-2's convention: <|endoftext|> is bos, eos, unk and (here) pad. No BOS is added: the
    model saw documents each followed by <|endoftext|>, never a BOS before a document."""
    return {
        "add_bos_token": False, "add_eos_token": False,
        "added_tokens_decoder": {str(EOT_ID): {
            "content": EOT, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}},
        "backend": "tokenizers", "clean_up_tokenization_spaces": False,
        "model_max_length": seq_len, "tokenizer_class": "PreTrainedTokenizerFast",
        **special_tokens_map(),
    }


def special_tokens_map() -> dict:
    return {"bos_token": EOT, "eos_token": EOT, "pad_token": EOT, "unk_token": EOT}


def tensors(layout: dict, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Every table entry as its own [out, in] array, by its HF name."""
    return {p["name"]: flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"]).copy()
            for p in layout["params"]}


def load_weights(run: dict, data_dir: Path, layout: dict, step: int | None = None) -> np.ndarray:
    """W: the final upload, or with `step`, the first section of that checkpoint (verified
    against its recorded SHA-256 first)."""
    if step is not None:
        return checkpoint_weights(run, data_dir, layout, step)
    src = weights_path(data_dir, run["id"])
    if not src.exists():
        raise FileNotFoundError(f"run {run['id']} has no saved weights (it has not ended in a "
                                "browser that uploaded them)")
    flat = np.fromfile(src, dtype="<f4")
    if flat.size != layout["total_numel"]:
        raise ValueError(f"{src} holds {flat.size} floats, the layout {layout['total_numel']}")
    return flat


def checkpoint_weights(run: dict, data_dir: Path, layout: dict, step: int) -> np.ndarray:
    from andrea.checkpoints import CheckpointError, CheckpointStore

    try:
        meta = CheckpointStore(data_dir, kept=1).get(run["id"], step)
        if meta is None:
            raise CheckpointError(404, f"run {run['id']} has no checkpoint at step {step}")
        if meta["sections"][0]["name"] != "W":
            raise ValueError(f"checkpoint {step} of run {run['id']} does not start with W")
        raw = CheckpointStore(data_dir, kept=1).read_section(run["id"], step, 0)
    except CheckpointError as e:
        raise (FileNotFoundError if e.status == 404 else ValueError)(str(e)) from None
    flat = np.frombuffer(raw, dtype="<f4")
    if flat.size != layout["total_numel"]:
        raise ValueError(f"checkpoint {step} of run {run['id']} holds {flat.size} weights, "
                         f"the layout {layout['total_numel']}")
    return flat


def write_weights(run: dict, data_dir: Path, out: Path, step: int | None = None) -> Path:
    """model.safetensors alone (the browser's download); `step`: from that checkpoint."""
    from safetensors.numpy import save_file

    layout = run_layout(run["config"])
    flat = load_weights(run, data_dir, layout, step)
    out.mkdir(parents=True, exist_ok=True)
    # One metadata key only: safetensors writes __metadata__ from a hash map whose order varies
    # per call, and the same weights must give the same bytes (a download equals a CLI export).
    save_file(tensors(layout, flat), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out / "model.safetensors"


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def check_eot(tokenizer: Path) -> None:
    """The ids in the configs are only right if the tokenizer's <|endoftext|> is id 0."""
    added = json.loads(tokenizer.read_text(encoding="utf-8")).get("added_tokens", [])
    if not any(t["content"] == EOT and t["id"] == EOT_ID for t in added):
        raise ValueError(f"{tokenizer} does not have {EOT} as token {EOT_ID}")


def write_tokenizer(tokenizer: Path, seq_len: int, out: Path) -> None:
    check_eot(tokenizer)
    shutil.copyfile(tokenizer, out / "tokenizer.json")
    _write_json(out / "tokenizer_config.json", tokenizer_config(seq_len))
    _write_json(out / "special_tokens_map.json", special_tokens_map())


def _clear_tokenizer(out: Path) -> None:
    """An earlier export's tokenizer files would pair a stale tokenizer with these weights."""
    for name in TOKENIZER_FILES:
        (out / name).unlink(missing_ok=True)


def export_run(run: dict, data_dir: Path, tokenizer: Path | None, out: Path,
               metrics: list[dict] | None = None, step: int | None = None) -> Path:
    """The whole checkpoint in `out`; without a tokenizer, the weights, configs and card only.
    `metrics`: the run's step records (Store.metrics), for the model card. `step`: the weights
    of that training checkpoint, and the card tells of the steps up to it."""
    layout = run_layout(run["config"])
    write_weights(run, data_dir, out, step)
    if step is not None:
        metrics = [m for m in metrics or [] if m["step"] <= step]
    _write_json(out / "config.json", {**hf_config(layout["config"]), "andrea_run": run["id"]})
    seq_len = run["config"]["seq_len"]
    _write_json(out / "generation_config.json", generation_config(seq_len))
    _clear_tokenizer(out)
    if tokenizer is not None:
        write_tokenizer(tokenizer, seq_len, out)
    corpus = corpus_meta(data_dir, run)
    (out / "README.md").write_text(model_card(run, layout, metrics or [], corpus, step),
                                   encoding="utf-8")
    return out


class UsageError(ValueError):
    """The run or its database is not there: the command was asked the wrong thing."""


def export_local(data_dir: Path, run_id: str, out: Path, step: int | None = None,
                 database_url: str | None = None) -> Path:
    """`andrea export RUN_ID --out OUT [--step K]`: the run, its metrics and tokenizer from a
    data dir (and the database at `database_url`, ANDREA_DATABASE_URL, when it is not the data
    dir's SQLite file); with `step`, the weights of that checkpoint."""
    from andrea.store import Store

    data_dir = Path(data_dir).resolve()
    if not database_url and not (data_dir / "andrea.sqlite").exists():
        raise UsageError(f"no database in {data_dir}")
    store = Store.open(database_url, data_dir / "andrea.sqlite")
    try:
        run = store.get_run(run_id)
        if run is None:
            raise UsageError(f"unknown run {run_id!r} in {data_dir}")
        metrics = store.metrics(run_id)
    finally:
        store.close()
    return export_run(run, data_dir, tokenizer_path(data_dir, run), Path(out), metrics, step)


def fetch_export(server: str, run_id: str, out: Path, step: int | None = None) -> Path:
    """`andrea export RUN_ID --server URL [--step K]`: the same files, made by the server
    (GET /api/runs/{id}/export.zip[?step=K] runs export_run there) and unpacked here."""
    import tempfile
    import urllib.parse

    base = f"{server.rstrip('/')}/api/runs/{urllib.parse.quote(run_id, safe='')}"
    _http_get(base, run_id, server)   # an unknown run is a usage error, not a failure
    with tempfile.TemporaryFile() as tmp:
        query = "" if step is None else f"?step={int(step)}"
        _http_get(base + "/export.zip" + query, run_id, server, into=tmp)
        return unzip_checkpoint(tmp, Path(out))


def _http_get(url: str, run_id: str, server: str, into=None) -> None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=600) as r:
            if into is not None:
                shutil.copyfileobj(r, into, 1 << 20)
    except urllib.error.HTTPError as e:
        if e.code == 404 and into is None:
            raise UsageError(f"unknown run {run_id!r} on {server}") from None
        raise OSError(f"{server} answered {e.code}: {_detail(e)}") from None
    except urllib.error.URLError as e:
        raise OSError(f"cannot reach {server}: {e.reason}") from None


def _detail(e) -> str:
    """FastAPI's {"detail": ...} message, or the body's first line."""
    body = e.read().decode("utf-8", "replace")
    try:
        return str(json.loads(body)["detail"])
    except (ValueError, KeyError, TypeError):
        return body.strip().splitlines()[0] if body.strip() else str(e.reason)


def unzip_checkpoint(file, out: Path) -> Path:
    """Plain file names only: an archive cannot write outside `out`."""
    with zipfile.ZipFile(file) as zf:
        names = zf.namelist()
        bad = [n for n in names if Path(n).name != n or n in ("", ".", "..")]
        if bad:
            raise ValueError(f"unexpected path in the export archive: {bad[0]!r}")
        out.mkdir(parents=True, exist_ok=True)
        _clear_tokenizer(out)
        for name in names:
            with zf.open(name) as src, open(out / name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return out


def zip_folder(folder: Path, dest: Path) -> Path:
    """The folder's files as one uncompressed zip with fixed times: the same files, the same
    bytes (safetensors hardly compresses, and storing keeps a large export fast)."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted(folder.iterdir()):
            info = zipfile.ZipInfo(path.name, ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.file_size = path.stat().st_size
            with open(path, "rb") as src, zf.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return dest


# ---- the model card ------------------------------------------------------------------------

def corpus_meta(data_dir: Path, run: dict) -> dict | None:
    """The run's token files' meta.json (source names and sizes): no tokenizing, just a read."""
    cfg = run["config"]
    path = tokens_dir(data_dir, cfg.get("corpus_hash", ""), run_model(cfg).vocab_size)
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


def optimizer_text(cfg: dict) -> str:
    state = ("8-bit AdamW (block-wise quantized moments, bitsandbytes-style)"
             if cfg["optimizer"] == "adamw_8bit" else "AdamW (fp32 moments)")
    mirror = ", matmuls on an f16 mirror of the f32 weights" if cfg.get("f16_mirror") else ""
    clip = f", gradient clipping at norm {cfg['max_norm']:g}" if cfg["clip"] else ""
    return (f"{state}{mirror}; betas ({cfg['beta1']:g}, {cfg['beta2']:g}), eps {cfg['eps']:g}, "
            f"weight decay {cfg['weight_decay']:g}{clip}")


def schedule_text(cfg: dict) -> str:
    w = cfg["warmup_steps"]
    warmup = f"linear warmup over {w:,} step{'s' * (w != 1)}, then " if w else ""
    return (f"peak {cfg['lr']:g}, {warmup}cosine decay to {cfg['lr'] * cfg['min_lr_ratio']:g} "
            f"at step {cfg['steps']:,}")


DATA_MODES = {
    "uniform": "each batch row from a source picked with equal probability",
    "bandit": "sources mixed by a bandit that favours the sources whose loss still falls",
}


def data_text(cfg: dict, corpus: dict | None) -> str:
    mode = cfg["data_mode"]
    lines = [f"Corpus `{cfg.get('corpus_hash', '')}`, data mode `{mode}` "
             f"({DATA_MODES.get(mode, mode)}); the last {_val_pct(corpus)} of each source is "
             f"held out for the eval loss. Each document is followed by `{EOT}` in the token "
             "stream.", ""]
    picked = cfg.get("sources")          # the run's sources (None: every one of the corpus)
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


def model_rows(layout: dict, cfg: dict) -> list[tuple[str, str]]:
    m = layout["config"]
    return [
        ("architecture", "LlamaForCausalLM: RMSNorm, RoPE, SwiGLU, tied input/output embeddings"),
        ("parameters", f"{layout['n_params']:,}"),
        ("layers, heads, width, FFN",
         f"{m['n_layer']}, {m['n_head']}, {m['n_embd']}, {m['ffn_dim']}"),
        ("vocabulary", f"{m['vocab_size']:,} byte-level BPE tokens; `{EOT}` (id {EOT_ID}) "
                       "ends a document"),
        ("context", f"trained on {cfg['seq_len']:,}-token windows (positions up to "
                    f"{m['seq_len']:,})"),
    ]


def training_rows(run: dict, metrics: list[dict],
                  step: int | None = None) -> list[tuple[str, str]]:
    cfg, s = run["config"], summary(metrics)
    tokens = s["steps"] * cfg["batch_size"] * cfg["seq_len"]
    status = run.get("status") or "unknown"
    return [
        ("status", status if step is None else f"the checkpoint of step {step:,} (run {status})"),
        ("steps", f"{s['steps']:,} of {cfg['steps']:,}"),
        ("batch", f"{cfg['batch_size']} x {cfg['seq_len']} tokens"),
        ("tokens seen", f"{tokens:,} (steps x batch size x context)"),
        ("final train loss", _loss(s["loss"])),
        ("final eval loss", _loss(s["eval"])),
        ("best eval loss", _loss(s["best_eval"])),
        ("optimizer", optimizer_text(cfg)),
        ("learning rate", schedule_text(cfg)),
        ("seed", str(cfg["seed"])),
    ]


def model_card(run: dict, layout: dict, metrics: list[dict], corpus: dict | None,
               step: int | None = None) -> str:
    cfg = run["config"]
    made_with = f"andrea export {run['id']}" + (f" --step {step}" if step else "") + " --out DIR"
    return "\n".join([
        FRONT_MATTER,
        f"# Andrea run {run['id']}", "",
        f"A small Llama-style causal language model (`{model_name(cfg)}`) trained from "
        "scratch in a web browser with WebGPU by Andrea, exported as a Hugging Face checkpoint.",
        "", "## Model", "", _table(model_rows(layout, cfg)), "",
        "## Training", "", _table(training_rows(run, metrics, step)), "",
        "Losses are mean token cross-entropy in nats.", "",
        "## Data", "", data_text(cfg, corpus), "",
        USAGE,
        "## Made with", "", "```", made_with, "```", "",
    ])
