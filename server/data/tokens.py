"""Token storage: per source, one flat little-endian uint16 file read through numpy memmap.

Layout under `<data_dir>/tokens/<corpus_hash>_<V>/`: `meta.json` plus `<i>_<name>.u16`, the
source's documents tokenized one by one, each followed by `<|endoftext|>`. Built once, reused
while the corpus and tokenizer are unchanged (both are in the folder's key and in meta.json);
a different corpus hashes to a different folder.

Split, by document: the documents at the end of each file (they are in name-hash order, a fair
sample) whose tokens come closest to VAL_FRACTION of the file, [n_train, n), are held out for
validation; n_train is a document boundary (just after an end-of-text), and training windows lie
wholly inside [0, n_train), so no token of a validation document is ever trained on. A source of
a single document (one .txt file) has no boundary to cut at: it is cut at VAL_FRACTION of its
tokens instead, and its meta entry says "split": "tokens".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from andrea.data.sources import Source
from andrea.data.tokenizer import EOT
from andrea.durable import fsync_dir

VAL_FRACTION = 0.1
# In meta.json: caches split or encoded another way are rebuilt.
SPLIT_RULE = "documents within 2x of val_fraction, else tokens; special-token text as text"
TOKEN_DTYPE = np.dtype("<u2")       # V <= 65536 (ModelConfig checks it)
ENCODE_CHUNK_CHARS = 4_000_000      # bounds memory when tokenizing a large user source
PIECE_CHARS = 1_000_000             # a huge single document is tokenized in line-aligned pieces


@dataclass(frozen=True)
class TokenFile:
    name: str
    tokens: np.ndarray              # (n,) uint16 memmap
    n_train: int                    # [0, n_train) train, [n_train, n) validation

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_val(self) -> int:
        return self.n_tokens - self.n_train


def tokens_dir(data_dir: Path, corpus_hash: str, vocab_size: int) -> Path:
    return Path(data_dir) / "tokens" / f"{corpus_hash}_{vocab_size}"


def _pieces(doc: str):
    while len(doc) > PIECE_CHARS:
        cut = doc.rfind("\n", 0, PIECE_CHARS) + 1 or PIECE_CHARS
        yield doc[:cut]
        doc = doc[cut:]
    yield doc


def split_point(ends: list[int], val_fraction: float = VAL_FRACTION) -> tuple[int, str]:
    """(n_train, how) for a file whose documents end (after their end-of-text) at `ends`:
    the document boundary nearest to (1 - val_fraction) of the tokens, the later one on a tie,
    never 0 or n; the token position itself ("tokens") with one document, or where that
    boundary would hold out less than half or more than twice val_fraction (one long document:
    a book after a short README held out 99.99% of its source, and trained on none of it)."""
    n = ends[-1]
    target = n - int(n * val_fraction)
    if len(ends) >= 2:
        b = min(ends[:-1], key=lambda b: (abs(b - target), -b))
        if val_fraction / 2 <= (n - b) / n <= 2 * val_fraction:
            return b, "documents"
    return target, "tokens"


def _write_source(tok: Tokenizer, source: Source, path: Path) -> list[int]:
    """Writes the token file; returns the token count after each document's end-of-text.
    Documents are encoded many to a batch (encode_batch spreads a batch over the cores: one
    document per call kept the embedded corpus's thousands of files on one core)."""
    eot = np.asarray([tok.token_to_id(EOT)], dtype=TOKEN_DTYPE).tobytes()
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    n = 0
    ends = []
    with open(path, "wb") as f:
        batch, last, chars = [], [], 0     # pieces; whether each ends its document

        def flush():
            nonlocal n
            for enc, ends_doc in zip(encode(batch, add_special_tokens=False), last):
                ids = np.asarray(enc.ids, dtype=TOKEN_DTYPE)
                f.write(ids.tobytes())
                n += ids.size
                if ends_doc:               # the document's tokens, then the separator
                    f.write(eot)
                    n += 1
                    ends.append(n)
            batch.clear()
            last.clear()

        for doc in source.documents:
            for piece in _pieces(doc):
                batch.append(piece)
                last.append(False)
                chars += len(piece)
                if chars >= ENCODE_CHUNK_CHARS:
                    flush()
                    chars = 0
            if last:
                last[-1] = True
            else:                          # its pieces went with the flush just above
                f.write(eot)
                n += 1
                ends.append(n)
        flush()
    return ends


def _file_name(i: int, name: str) -> str:
    return f"{i:03d}_{name}.u16"


def _build(folder: Path, tok: Tokenizer, sources: list[Source], meta_base: dict) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    try:
        entries = []
        # Text that spells the end-of-text token is text, not a document boundary (the tokenizer
        # matches special tokens inside its input by default): encoded by a copy that does not.
        encoder = Tokenizer.from_str(tok.to_str())
        encoder.encode_special_tokens = True
        for i, s in enumerate(sources):
            ends = _write_source(encoder, s, tmp / _file_name(i, s.name))
            n_train, how = split_point(ends)
            entries.append({"name": s.name, "file": _file_name(i, s.name), "n_tokens": ends[-1],
                            "n_train": n_train, "n_chars": s.n_chars,
                            "n_documents": len(s.documents), "split": how,
                            "n_val_documents": len(ends) - ends.index(n_train) - 1
                            if how == "documents" else 0})
        (tmp / "meta.json").write_text(json.dumps({**meta_base, "sources": entries}, indent=1))
        for f in tmp.iterdir():         # on disk before the folder is (a machine's crash after
            fsync_dir(f)                # the rename would leave files of the right size unsynced;
        fsync_dir(tmp)                  # fsync_dir syncs a file as well)
        try:
            os.rename(tmp, folder)      # atomic; fails if another process finished first
        except OSError:
            if not (folder / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _valid(folder: Path, meta_base: dict) -> dict | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if any(meta.get(k) != v for k, v in meta_base.items()):
        return None
    for e in meta["sources"]:
        f = folder / e["file"]
        if not f.exists() or f.stat().st_size != e["n_tokens"] * TOKEN_DTYPE.itemsize:
            return None
    return meta


def load_or_build(data_dir: Path, corpus_hash: str, vocab_size: int, tok: Tokenizer,
                  tokenizer_path: Path, sources: list[Source]) -> tuple[list[TokenFile], dict]:
    tok_sha = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()[:16]
    folder = tokens_dir(data_dir, corpus_hash, vocab_size)
    base = {"corpus_hash": corpus_hash, "tokenizer_sha256": tok_sha, "vocab_size": vocab_size,
            "val_fraction": VAL_FRACTION, "split": SPLIT_RULE, "dtype": TOKEN_DTYPE.str}
    meta = _valid(folder, base)
    if meta is None:
        shutil.rmtree(folder, ignore_errors=True)   # stale or half-written: rebuild
        _build(folder, tok, sources, base)
        meta = _valid(folder, base)
        if meta is None:
            raise RuntimeError(f"token files in {folder} are inconsistent after building")
    files = [TokenFile(e["name"], np.memmap(folder / e["file"], dtype=TOKEN_DTYPE, mode="r"),
                       e["n_train"]) for e in meta["sources"]]
    return files, meta
