"""Trained weights: the training tab uploads W (f32, table offsets) when a run ends; export turns
them into a Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json) that
`LlamaForCausalLM.from_pretrained` loads as it is: the table's names are HF's names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from andrea.model import PRESETS, build_layout


def weights_path(data_dir: Path, run_id: str) -> Path:
    return data_dir / "runs" / run_id / "weights.f32"


def hf_config(config: dict) -> dict:
    """config.json for LlamaForCausalLM, from the model config of the parameter table."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config["vocab_size"], "hidden_size": config["n_embd"],
        "intermediate_size": config["ffn_dim"], "num_hidden_layers": config["n_layer"],
        "num_attention_heads": config["n_head"], "num_key_value_heads": config["n_head"],
        "head_dim": config["head_dim"], "max_position_embeddings": config["seq_len"],
        "rms_norm_eps": config["norm_eps"], "rope_theta": config["rope_theta"],
        "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "torch_dtype": "float32",
    }


def tensors(layout: dict, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Every table entry as its own [out, in] array, by its HF name."""
    return {p["name"]: flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"]).copy()
            for p in layout["params"]}


def export_run(run: dict, data_dir: Path, tokenizer_path: Path | None, out: Path) -> Path:
    from safetensors.numpy import save_file

    layout = build_layout(PRESETS[run["config"]["preset"]])
    src = weights_path(data_dir, run["id"])
    if not src.exists():
        raise FileNotFoundError(f"run {run['id']} has no saved weights (it has not ended in a "
                                "browser that uploaded them)")
    flat = np.fromfile(src, dtype="<f4")
    if flat.size != layout["total_numel"]:
        raise ValueError(f"{src} holds {flat.size} floats, the layout {layout['total_numel']}")
    out.mkdir(parents=True, exist_ok=True)
    # One metadata key only: safetensors writes __metadata__ from a hash map whose order varies
    # per call, and the same weights must give the same bytes (a download equals a CLI export).
    save_file(tensors(layout, flat), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {**hf_config(layout["config"]), "andrea_run": run["id"]}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer_path is not None:
        shutil.copyfile(tokenizer_path, out / "tokenizer.json")
    return out
