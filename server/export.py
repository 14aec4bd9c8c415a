"""Trained weights: the training tab uploads W (f32, table offsets) when a run ends; export turns
them into a complete Hugging Face checkpoint that `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load as it is (the table's names are HF's names):

  config.json              LlamaConfig (the keys transformers 5 writes, plus `andrea_run`)
  generation_config.json   stop at <|endoftext|>, at most the run's context
  model.safetensors        the weights, f32
  tokenizer.json           the run's byte-level BPE, byte for byte as it trained
  tokenizer_config.json    eos/bos/pad/unk = <|endoftext|>, no automatic BOS, model_max_length
  special_tokens_map.json  the same special tokens, for older loaders
  README.md                a model card: what was trained, on what, how far (model_card.py)

Everything is a pure function of the run, the summary of its metrics and the files in the data
dir, with no clock or path in it: the same run exported twice, or through a server, gives the
same bytes. model.safetensors is written as a stream (safetensors_stream: its header, then each
tensor read from the weights in pieces), so a download needs no copy on disk and no run is
ever held whole in memory; the server's export.zip is the same files (export_files) zipped as
they are sent (zip_stream), never written to its disk.
transformers is not imported here (it is no runtime dependency): the JSON is written as
transformers 5.24 writes it itself (tests/api/test_export.py loads the result with it).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from andrea import tasks
from andrea.data.tokenizer import EOT, EOT_ID, tokenizer_dir
from andrea.durable import write_atomic
from andrea.model_card import corpus_meta, model_card, summary
from andrea.paths import weights_path
from andrea.run_config import run_layout

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)   # zip entries carry no clock: the archive is deterministic


def tokenizer_path(data_dir: Path, run: dict) -> Path | None:
    """The tokenizer the run trained with: a corpus run's cached under its corpus hash, if
    built; a toy task run's alphabet (tasks.py), written there the first time."""
    cfg = run["config"]
    if cfg.task:
        path = tokenizer_dir(data_dir, tasks.TOKENIZER_KEY, tasks.VOCAB) / "tokenizer.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, tasks.tokenizer().to_str().encode("utf-8"))
        return path
    path = tokenizer_dir(data_dir, cfg.corpus_hash, cfg.vocab_size) / "tokenizer.json"
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


def end_token(run: dict) -> str:
    """What ends a run's text, token 0 (generation's eos): <|endoftext|> after each document of
    a corpus, the newline after each problem of a toy task."""
    return tasks.END if run["config"].task else EOT


def tokenizer_config(seq_len: int, end: str = EOT) -> dict:
    """GPT-2's convention: <|endoftext|> is bos, eos, unk and (here) pad. No BOS is added: the
    model saw documents each followed by <|endoftext|>, never a BOS before a document. A task's
    newline is an ordinary token of its alphabet, its bos, eos and pad."""
    added = {"added_tokens_decoder": {str(EOT_ID): {
        "content": EOT, "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True}}} if end == EOT else {}
    return {
        "add_bos_token": False, "add_eos_token": False, **added,
        "backend": "tokenizers", "clean_up_tokenization_spaces": False,
        "model_max_length": seq_len, "tokenizer_class": "PreTrainedTokenizerFast",
        **special_tokens_map(end),
    }


def special_tokens_map(end: str = EOT) -> dict:
    return {"bos_token": end, "eos_token": end, "pad_token": end,
            **({"unk_token": end} if end == EOT else {})}


def tensors(layout: dict, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Every table entry as its own [out, in] array, by its HF name."""
    return {p["name"]: flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"]).copy()
            for p in layout["params"]}


SAFETENSORS_PIECE = 1 << 20     # bytes read and sent at a time: a download holds no more


class NoWeights(FileNotFoundError):
    """The run has no final upload, or no checkpoint at the step asked for."""


def open_weights(run: dict, data_dir: Path, layout: dict, step: int | None = None):
    """W as an open file positioned at its first float: the final upload, or with `step`, the
    first section of that checkpoint (verified against its recorded SHA-256 first).
    NoWeights (a FileNotFoundError) when there is none, ValueError when it is damaged or of the
    wrong size."""
    size = 4 * layout["total_numel"]
    if step is not None:
        from andrea.checkpoints import CheckpointError, CheckpointStore
        from andrea.errors import NOT_FOUND

        store = CheckpointStore(data_dir)    # a reader: it keeps no count, it never commits
        try:
            meta, f = store.open_verified(run["id"], step)
        except CheckpointError as e:
            raise (NoWeights if e.kind is NOT_FOUND else ValueError)(str(e)) from None
        first = meta["sections"][0]
        if first["name"] != "W" or first["bytes"] != size:
            f.close()
            raise ValueError(f"checkpoint {step} of run {run['id']} does not start with W of "
                             f"{layout['total_numel']} weights")
        f.seek(0)
        return f
    src = weights_path(data_dir, run["id"])
    try:
        f = open(src, "rb")     # a later upload replaces the file: this one stays whole
    except FileNotFoundError:
        raise NoWeights(f"run {run['id']} has no saved weights (it has not ended in a "
                        "browser that uploaded them)") from None
    got = os.fstat(f.fileno()).st_size
    if got != size:
        f.close()
        raise ValueError(f"{src} holds {got // 4} floats, the layout {layout['total_numel']}")
    return f


def safetensors_header(layout: dict) -> bytes:
    """The first bytes of model.safetensors as safetensors' save_file writes them: the header's
    length, then its JSON (one metadata key; tensors by name, the order save_file stores them
    in) padded with spaces to 8 bytes."""
    entries, at = {}, 0
    for p in sorted(layout["params"], key=lambda p: p["name"]):
        entries[p["name"]] = {"dtype": "F32", "shape": list(p["shape"]),
                              "data_offsets": [at, at + 4 * p["numel"]]}
        at += 4 * p["numel"]
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header


def safetensors_stream(run: dict, data_dir: Path, step: int | None = None
                       ) -> tuple[int, Iterator[bytes]]:
    """model.safetensors (the same bytes as save_file of `tensors`) as (its size, its pieces):
    the header, then each tensor read from the weights file a piece at a time, so neither a
    copy on disk nor the whole W in memory. One metadata key only: save_file writes
    __metadata__ from a hash map whose order varies, and the same weights must give the same
    bytes (a download equals a CLI export). Errors (open_weights') come before the first
    piece."""
    layout = run_layout(run["config"])
    f = open_weights(run, data_dir, layout, step)
    head = safetensors_header(layout)

    def pieces() -> Iterator[bytes]:
        with f:
            yield head
            for p in sorted(layout["params"], key=lambda p: p["name"]):
                start, end = 4 * p["offset"], 4 * (p["offset"] + p["numel"])
                for at in range(start, end, SAFETENSORS_PIECE):
                    f.seek(at)
                    piece = f.read(min(SAFETENSORS_PIECE, end - at))
                    if len(piece) != min(SAFETENSORS_PIECE, end - at):
                        raise ValueError(f"the weights of run {run['id']} ended early")
                    yield piece
    # (The table may pad between entries: the file holds the entries alone.)
    return len(head) + 4 * sum(p["numel"] for p in layout["params"]), pieces()


def write_weights(run: dict, data_dir: Path, out: Path, step: int | None = None) -> Path:
    """model.safetensors alone (safetensors_stream into a file); `step`: from that checkpoint."""
    _, pieces = safetensors_stream(run, data_dir, step)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "model.safetensors", "wb") as dst:
        for piece in pieces:
            dst.write(piece)
    return out / "model.safetensors"


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def check_end(tokenizer: Path, end: str = EOT) -> None:
    """The ids in the configs are only right if the run's end token is the tokenizer's id 0:
    <|endoftext|> (an added token of a corpus's BPE), a task's newline (of its alphabet)."""
    spec = json.loads(tokenizer.read_text(encoding="utf-8"))
    ids = {**spec["model"].get("vocab", {}),
           **{t["content"]: t["id"] for t in spec.get("added_tokens", [])}}
    if ids.get(end) != EOT_ID:
        raise ValueError(f"{tokenizer} does not have {end!r} as token {EOT_ID}")


def clear_tokenizer(out: Path) -> None:
    """An earlier export's tokenizer files would pair a stale tokenizer with these weights."""
    for name in TOKENIZER_FILES:
        (out / name).unlink(missing_ok=True)


class ExportFile(NamedTuple):
    """One file of an export: its name, its size and its bytes, made as they are read (once)."""
    name: str
    size: int
    pieces: Iterator[bytes]


def _json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")   # _write_json's


def _once(data: bytes) -> Iterator[bytes]:
    yield data


def _file_pieces(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while piece := f.read(SAFETENSORS_PIECE):
            yield piece


def export_files(run: dict, data_dir: Path, tokenizer: Path | None,
                 records: dict | None = None, step: int | None = None,
                 corpus_dir: Path | None = None) -> list[ExportFile]:
    """The checkpoint's files (export_run's arguments), by name: model.safetensors streamed from
    the weights (safetensors_stream) and tokenizer.json from its file, a piece at a time, the
    configs and card in memory (a few KiB). Errors (no weights, a damaged checkpoint, a foreign
    tokenizer) come here, before any byte is made."""
    layout = run_layout(run["config"])
    seq_len = run["config"].seq_len
    small = {"config.json": _json_bytes({**hf_config(layout["config"]), "andrea_run": run["id"]}),
             "generation_config.json": _json_bytes(generation_config(seq_len))}
    files = []
    if tokenizer is not None:
        end = end_token(run)
        check_end(tokenizer, end)
        small["tokenizer_config.json"] = _json_bytes(tokenizer_config(seq_len, end))
        small["special_tokens_map.json"] = _json_bytes(special_tokens_map(end))
        files.append(ExportFile("tokenizer.json", os.stat(tokenizer).st_size,
                                _file_pieces(tokenizer)))
    corpus = corpus_meta(corpus_dir or data_dir, run)
    small["README.md"] = model_card(run, layout, records or summary([]), corpus,
                                    step).encode("utf-8")
    size, weights = safetensors_stream(run, data_dir, step)    # last: it opens the weights
    files.append(ExportFile("model.safetensors", size, weights))
    files += [ExportFile(name, len(data), _once(data)) for name, data in small.items()]
    return sorted(files, key=lambda f: f.name)


def export_run(run: dict, data_dir: Path, tokenizer: Path | None, out: Path,
               records: dict | None = None, step: int | None = None,
               corpus_dir: Path | None = None) -> Path:
    """The whole checkpoint in `out`; without a tokenizer, the weights, configs and card only.
    `records`: the summary of the run's records up to `step` for the model card
    (store.Metrics.card_summary; model_card.summary of a list is the same). `step`: the weights of
    that training checkpoint, and the card tells of the steps up to it. `corpus_dir`: where
    the token files are (Settings.corpus_dir; default the data dir). The files are
    export_files' (the server's zip streams the same)."""
    files = export_files(run, data_dir, tokenizer, records, step, corpus_dir)
    out.mkdir(parents=True, exist_ok=True)
    clear_tokenizer(out)
    for f in files:
        with open(out / f.name, "wb") as dst:
            for piece in f.pieces:
                dst.write(piece)
    return out


def zip_stream(files: list[ExportFile], out) -> None:
    """`files` as one uncompressed zip with fixed times (zip_folder's entries), written to
    `out` as it is made: any object with write() (a response's pipe: it need not seek, each
    entry then carries its CRC and sizes in a data descriptor after its bytes)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for f in files:
            info = zipfile.ZipInfo(f.name, ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.file_size = f.size     # (so zip64 is used where it must be)
            with zf.open(info, "w") as dst:
                for piece in f.pieces:
                    dst.write(piece)


class _Counter:
    def __init__(self):
        self.n = 0

    def write(self, data) -> int:
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def zip_size(files: list[ExportFile]) -> int | None:
    """The size of zip_stream's zip of `files` into a pipe (the archive of the same names
    without their bytes, plus their sizes), or None where it would need zip64 (2 GiB)."""
    data = sum(f.size for f in files)
    if 1.05 * data + (1 << 20) > zipfile.ZIP64_LIMIT:
        return None
    count = _Counter()
    zip_stream([ExportFile(f.name, f.size, iter(())) for f in files], count)
    return count.n + data


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
