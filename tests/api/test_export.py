"""`andrea export`: a complete Hugging Face checkpoint (configs, tokenizer files, model card)
that transformers loads from the folder alone and that stops generating at <|endoftext|>;
the same bytes every time, locally or through a running server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from andrea.app import create_app
from andrea.cli.launch import start_server, stop_server
from andrea.cli.main import main
from andrea.config import Settings
from andrea.store import Store
from tests.trainer_client import stored_config

STEPS = [  # what the card reports: steps done, the last loss, the last and the best eval loss
    {"step": 1, "loss": 6.2, "lr": 1e-3},
    {"step": 2, "loss": 5.9, "lr": 1e-3, "eval_loss": 5.5},
    {"step": 3, "loss": 5.1, "lr": 1e-3, "eval_loss": 5.7},
]
CHAIN_TEXT = "def main():"     # its last token starts the chain that ends at <|endoftext|>
CHAIN = 3                      # tokens generated after the prompt, the last one EOS


@pytest.fixture(scope="module")
def export_data(tiny, tmp_path_factory):
    """A data dir of this module's own; its tokenizers and token files are the session's
    (ANDREA_CACHE_DIR, see conftest.py: what its apps, servers and `andrea export` read), tiny's
    built already."""
    return tmp_path_factory.mktemp("export-data")


def chain_weights(layout: dict, ids: list[int]) -> np.ndarray:
    """W whose greedy continuation of ids[0] is ids[1], ids[2], ..., then token 0 forever.
    Only the chain's embedding rows are non-zero (one axis each); attention is zero and layer
    0's SwiGLU maps axis i to axis i + 1, so the logits depend on the last token alone. Any
    other token has a zero row: its logits are all 0 and argmax picks token 0 at once."""
    params = {p["name"]: p for p in layout["params"]}
    flat = np.zeros(layout["total_numel"], dtype=np.float32)

    def view(name):
        p = params[name]
        return flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"])

    for p in layout["params"]:
        if p["init"] == "ones":
            view(p["name"])[:] = 1.0
    emb = view("model.embed_tokens.weight")
    for axis, tok in enumerate(ids):
        emb[tok, axis] = 1.0
    mlp = "model.layers.0.mlp."
    gate, up, down = (view(mlp + n + "_proj.weight") for n in ("gate", "up", "down"))
    for axis in range(len(ids) - 1):
        gate[axis, axis] = up[axis, axis] = down[axis + 1, axis] = 1.0
    return flat


@pytest.fixture(scope="module")
def run(export_data, tiny):
    """A tiny run with chain weights uploaded and three steps of metrics."""
    with TestClient(create_app(Settings(data_dir=export_data))) as client:
        run = client.post("/api/runs", json={"preset": "tiny", "seq_len": 32, "batch_size": 4,
                                             "steps": 10}).json()
        assert run["config"]["corpus_hash"] == tiny.corpus_hash
        last = tiny.tokenizer.encode(CHAIN_TEXT).ids[-1]
        chain = [last] + [t for t in (300, 301) if t != last][:CHAIN - 1] + [0]
        w = chain_weights(run["layout"], chain)
        r = client.put(f"/api/runs/{run['id']}/weights", content=w.astype("<f4").tobytes(),
                       headers={"authorization": f"Bearer {run['token']}"})
        assert r.status_code == 204, r.text
    Store(export_data / "andrea.sqlite").metrics.add(run["id"], STEPS)
    return {**run, "chain": chain}


@pytest.fixture(scope="module")
def bare_run(export_data) -> str:
    """A run that never uploaded weights."""
    with TestClient(create_app(Settings(data_dir=export_data))) as client:
        return client.post("/api/runs", json={"preset": "tiny"}).json()["id"]


@pytest.fixture(scope="module")
def exported(run, export_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    assert main(["export", run["id"], "--out", str(out), "--data-dir", str(export_data)]) == 0
    return out


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_checkpoint_has_every_file(exported):
    assert set(files(exported)) == {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "README.md"}
    config = json.loads((exported / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 0
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert "pad_token_id" not in config    # it would freeze embedding row 0 when fine-tuning
    gen = json.loads((exported / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "max_length": 32}


def test_config_matches_what_transformers_writes(exported):
    """Every key is one LlamaConfig knows, with the value it reads back (dtype, rope, ids)."""
    from transformers import AutoConfig, LlamaConfig

    ours = json.loads((exported / "config.json").read_text())
    theirs = AutoConfig.from_pretrained(exported).to_dict()
    assert isinstance(AutoConfig.from_pretrained(exported), LlamaConfig)
    known = set(LlamaConfig().to_dict()) | {"architectures", "rope_theta", "andrea_run"}
    assert set(ours) <= known, set(ours) - known
    for key in set(ours) - {"rope_theta"}:
        assert theirs[key] == ours[key], key


def test_tokenizer_loads_with_eos_and_no_bos_insertion(exported, run):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = AutoTokenizer.from_pretrained(exported)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.eos_token == tok.bos_token == tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == 0 and tok.model_max_length == run["config"]["seq_len"]
    text = "def main():\n    return 0\n"
    ids = tok(text)["input_ids"]
    assert 0 not in ids and tok.decode(ids) == text     # no BOS, no EOS added
    assert tok("a<|endoftext|>b")["input_ids"].count(0) == 1


def test_generate_stops_at_end_of_text(exported, run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    tok = AutoTokenizer.from_pretrained(exported)
    prompt = tok(CHAIN_TEXT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=10, do_sample=False)[0].tolist()
    n = prompt["input_ids"].shape[1]
    assert out[n:] == run["chain"][1:], out            # the chain, then EOS, then it stops
    assert out[-1] == 0 and len(out) - n < 10


def test_pipeline_generates_from_the_folder(exported):
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(exported))
    text = generate(CHAIN_TEXT, max_new_tokens=5)[0]["generated_text"]
    assert text.startswith(CHAIN_TEXT)


def test_model_card(exported, run):
    card = (exported / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    assert f"andrea export {run['id']} --out DIR" in card
    assert f"| parameters | {run['layout']['n_params']:,} |" in card
    assert "| steps | 3 of 10 |" in card
    assert f"| tokens seen | {3 * 4 * 32:,} " in card
    assert "| final train loss | 5.1000 (step 3) |" in card
    assert "| final eval loss | 5.7000 (step 3) |" in card
    assert "| best eval loss | 5.5000 (step 2) |" in card
    assert "AdamW (fp32 moments)" in card and "python-docs" in card
    assert "weight decay 0.1, gradient clipping at norm 1 |" in card    # clip_mode global


CARD_CONFIG = {"optimizer": "adamw", "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
               "weight_decay": 0.1, "max_norm": 0.5}      # (stored_config's fields)


@pytest.mark.parametrize("mode,ending", [
    ("global", "weight decay 0.1, gradient clipping at norm 0.5"),
    ("per_tensor", "weight decay 0.1, per-tensor gradient clipping at norm 0.5"),
    ("off", "weight decay 0.1")])
def test_model_card_names_the_runs_clipping(mode, ending):
    from andrea.model_card import optimizer_text

    text = optimizer_text(stored_config(**CARD_CONFIG, clip_mode=mode))
    assert text.endswith(ending) and ("clipping" in text) == (mode != "off")


def test_model_card_lists_a_runs_picked_sources():
    """A run on some of the corpus's sources says so, and its card's table lists those alone."""
    from andrea.model_card import data_text

    meta = {"val_fraction": 0.1, "sources": [
        {"name": n, "n_documents": 10, "n_chars": 1000, "n_tokens": 400}
        for n in ("python-docs", "python-stdlib", "notes")]}
    cfg = {"data_mode": "uniform", "corpus_hash": "0123456789abcdef"}
    every = data_text(stored_config(**cfg), meta)
    assert all(f"| {n} |" in every for n in ("python-docs", "python-stdlib", "notes"))
    assert "only" not in every
    picked = data_text(stored_config(**cfg, sources=["python-docs", "notes"]), meta)
    assert "on 2 of the corpus's sources only: python-docs, notes (not python-stdlib;" in picked
    assert "| python-docs |" in picked and "| notes |" in picked
    assert "| python-stdlib |" not in picked
    assert "python-docs, notes." in data_text(
        stored_config(**cfg, sources=["python-docs", "notes"]), None)


def test_export_is_byte_identical_twice(run, export_data, exported, tmp_path):
    again = tmp_path / "again"
    assert main(["export", run["id"], "--out", str(again), "--data-dir", str(export_data)]) == 0
    assert files(again) == files(exported)


def test_server_export_equals_local_export(run, bare_run, export_data, exported, tmp_path,
                                           capsys, monkeypatch):
    proc, url = start_server(export_data)
    try:
        out, x = tmp_path / "fetched", str(tmp_path / "x")
        assert main(["export", run["id"], "--out", str(out), "--server", url]) == 0
        # Not found, whatever is missing: the run, its weights, the checkpoint asked for.
        assert main(["export", "nope", "--out", x, "--server", url]) == 2
        assert main(["export", bare_run, "--out", x, "--server", url]) == 2
        assert main(["export", run["id"], "--step", "5", "--out", x, "--server", url]) == 2
        monkeypatch.chdir(tmp_path)                 # no --out: ./RUN_ID, as locally
        assert main(["export", run["id"], "--server", url]) == 0
    finally:
        stop_server(proc)
    assert files(out) == files(exported) == files(tmp_path / run["id"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("andrea export: ") for line in err), err
    assert "unknown run" in err[0] and "no saved weights" in err[1]
    assert f"run {run['id']} has no checkpoint at step 5" in err[2]
    assert not Path(x).exists()


def test_cli_errors_are_one_line_and_not_found_is_code_2(run, bare_run, export_data, tmp_path,
                                                         capsys):
    """An unknown run, a run without weights and a checkpoint that is not there are all "not
    found" (exit 2, as a wrong command is); what could not be done is 1."""
    out = str(tmp_path / "x")
    data = ["--data-dir", str(export_data)]
    assert main(["export", "nope", "--out", out, *data]) == 2
    assert main(["export", run["id"], "--out", out, "--data-dir", str(tmp_path)]) == 2
    assert main(["export", bare_run, "--out", out, *data]) == 2
    assert main(["export", run["id"], "--step", "5", "--out", out, *data]) == 2
    assert main(["export", run["id"], "--out", out, "--server", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5 and all(line.startswith("andrea export: ") for line in err), err
    assert "unknown run" in err[0] and "no database" in err[1]
    assert "no saved weights" in err[2] and "no checkpoint at step 5" in err[3]
    assert "cannot reach" in err[4]


def test_export_without_out_writes_a_folder_named_after_the_run(run, export_data, exported,
                                                                 tmp_path, monkeypatch, capsys):
    """`andrea export RUN_ID`, as the README writes it, was a usage error (--out was required).
    It writes ./RUN_ID (./RUN_ID-stepK for a checkpoint), and never into a folder that holds
    something already: that one is refused, untouched (--out names a folder to replace)."""
    monkeypatch.chdir(tmp_path)
    data = ["--data-dir", str(export_data)]
    assert main(["export", run["id"], *data]) == 0
    assert files(tmp_path / run["id"]) == files(exported)
    assert f"wrote {run['id']}:" in capsys.readouterr().out
    assert main(["export", run["id"], *data]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"andrea export: {run['id']} exists and is not "
                                               "empty"), err
    assert "--out" in err[0]
    assert files(tmp_path / run["id"]) == files(exported)
    (tmp_path / "empty").mkdir()                # an empty folder is no export to lose
    monkeypatch.chdir(tmp_path / "empty")
    (tmp_path / "empty" / run["id"]).mkdir()
    assert main(["export", run["id"], *data]) == 0
    assert files(tmp_path / "empty" / run["id"]) == files(exported)
    assert main(["export", run["id"], "--out", str(tmp_path / run["id"]), *data]) == 0   # given
    from andrea.cli.export_command import default_out
    assert default_out(run["id"], None) == Path(run["id"])
    assert default_out(run["id"], 7) == Path(f"{run['id']}-step7")


def test_a_task_runs_export_has_its_alphabet_and_stops_at_the_newline(export_data, tmp_path):
    """A toy task run exports with its own tokenizer (one token per character of its alphabet,
    token 0 the newline that ends each problem: generation's eos), and transformers answers a
    problem from the folder alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from andrea import tasks

    with TestClient(create_app(Settings(data_dir=export_data))) as client:
        run = client.post("/api/runs", json={"preset": "tiny", "task": "reverse",
                                             "task_digits": 3, "steps": 10}).json()
        ids = [tasks.ALPHABET.index(c) for c in ">321"] + [0]    # "1 2 3 >" answers "321\n"
        w = chain_weights(run["layout"], ids)
        r = client.put(f"/api/runs/{run['id']}/weights", content=w.astype("<f4").tobytes(),
                       headers={"authorization": f"Bearer {run['token']}"})
        assert r.status_code == 204, r.text
    out = tmp_path / "task"
    assert main(["export", run["id"], "--out", str(out), "--data-dir", str(export_data)]) == 0
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(
        files(out))
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == tok.pad_token == "\n" and tok.eos_token_id == 0
    assert tok("123>")["input_ids"] == [tasks.ALPHABET.index(c) for c in "123>"]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    prompt = tok("123>", return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**prompt, max_new_tokens=8, do_sample=False)[0].tolist()
    assert tok.decode(gen[4:]) == "321\n", gen        # the answer, then the newline: it stops
    card = (out / "README.md").read_text()
    assert "The toy task `reverse`: reverse 3 digits" in card and "byte-level BPE" not in card
    assert 'answer("' in card and "<|endoftext|>" not in card
