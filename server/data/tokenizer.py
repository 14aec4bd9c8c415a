"""Byte-level BPE tokenizer (Hugging Face `tokenizers`), trained per (corpus, vocab size), cached.

ByteLevel pre-tokenizer + ByteLevel decoder with all 256 bytes in the initial alphabet, and no
normalizer: any text, in any script, round-trips exactly. One special token, `<|endoftext|>`
(id 0), separates documents in the token stream. The result is a standard `tokenizer.json`,
under `<data_dir>/tokenizers/<corpus_hash>_<V>/`, loadable with `Tokenizer.from_file` (or
`PreTrainedTokenizerFast(tokenizer_file=...)`) when the model is used from PyTorch.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from andrea.data.sources import Source, tokenizer_sample

EOT = "<|endoftext|>"
EOT_ID = 0                         # the only special token, so always the first id
MIN_VOCAB = 257                    # 256 byte tokens + the end-of-text token


def tokenizer_dir(data_dir: Path, corpus_hash: str, vocab_size: int) -> Path:
    return Path(data_dir) / "tokenizers" / f"{corpus_hash}_{vocab_size}"


def train_tokenizer(sources: list[Source], vocab_size: int) -> Tokenizer:
    if not MIN_VOCAB <= vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in [{MIN_VOCAB}, 65536], got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # A deterministic sample (sources.tokenizer_sample): the merges of 3 MB, in a second.
    tok.train_from_iterator(tokenizer_sample(sources), trainer)
    if tok.get_vocab_size() > vocab_size:  # the model's embedding has exactly V rows
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, more than {vocab_size}")
    return tok


def _publish(path: Path, text: str) -> None:
    """Write once: the first process to finish wins, later ones keep the file already there,
    so two servers sharing a data dir always agree on the tokenizer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())        # whole on disk before it is the tokenizer
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def load_or_train(data_dir: Path, sources: list[Source], corpus_hash: str,
                  vocab_size: int) -> tuple[Tokenizer, Path]:
    path = tokenizer_dir(data_dir, corpus_hash, vocab_size) / "tokenizer.json"
    if path.exists():
        try:
            return Tokenizer.from_file(str(path)), path
        except Exception:   # damaged (a machine's crash before it was synced): trained again
            path.unlink(missing_ok=True)
    _publish(path, train_tokenizer(sources, vocab_size).to_str())
    return Tokenizer.from_file(str(path)), path


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-char map, inverted: how ByteLevel spells each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tok: Tokenizer) -> list[bytes]:
    """id -> the exact bytes the token stands for (special tokens: their literal text).
    Concatenate and UTF-8-decode (TextDecoder) to read a sample, no BPE needed in the browser."""
    decoder = _byte_decoder()
    specials = {t.content for t in tok.get_added_tokens_decoder().values()}
    table: list[bytes] = [b""] * tok.get_vocab_size()
    for piece, i in tok.get_vocab().items():
        table[i] = piece.encode() if piece in specials else bytes(decoder[c] for c in piece)
    return table


def decode_table(tok: Tokenizer) -> list[str]:
    """token_bytes as base64 strings, for JSON."""
    return [base64.b64encode(b).decode("ascii") for b in token_bytes(tok)]


def decode(tok: Tokenizer, ids) -> str:
    return tok.decode(list(map(int, ids)), skip_special_tokens=False)
