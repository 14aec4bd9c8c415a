"""Tokenizer round trip and the on-disk caches (the browser's decode table, served:
tests/api/test_data_tokenizer_routes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from andrea.data import tokenizer as tk
from andrea.data import tokens as tokens_module
from andrea.data.hub import DataHub
from andrea.data.tokens import tokens_dir
from tests.data_fixtures import TINY_V

NON_ASCII = [
    "D'où Viennent les Pics de Gradients : un mini-lot calme & un choquant.",
    "Ærøskøbing, Straße, naïve café — «guillemets» et œuvre",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 🧪🚀 and ZWJ 👩‍🔬, math ∑ x² ≤ ∞, RTL שלום مرحبا",
    "tabs\tand\r\nCRLF\u00a0nbsp\u200b zero-width, \x00 NUL and \x7f DEL",
    "<|endoftext|> a literal separator inside text",
]


def test_vocab_size_is_the_presets(tiny):
    assert tiny.tokenizer.get_vocab_size() == TINY_V
    assert tiny.tokenizer.token_to_id(tk.EOT) == 0


def test_round_trip_every_source(tiny):
    """Every document of every source comes back exactly from its token file (decoding the
    whole file at once: each document, then the end-of-text text)."""
    tok = tiny.tokenizer
    for f, source in zip(tiny.files, tiny.sources):
        expected = "".join(d + tk.EOT for d in source.documents)
        assert tk.decode(tok, np.asarray(f.tokens)) == expected, source.name


@pytest.mark.parametrize("text", NON_ASCII)
def test_round_trip_non_ascii(tiny, text):
    ids = tiny.tokenizer.encode(text).ids
    assert tk.decode(tiny.tokenizer, ids) == text
    assert max(ids) < TINY_V


def test_token_files_decode_to_the_sources(tiny):
    tok = tiny.tokenizer
    for f, source in zip(tiny.files, tiny.sources):
        ids = np.asarray(f.tokens)
        ends = np.flatnonzero(ids == 0)
        assert len(ends) == len(source.documents) and ends[-1] == len(ids) - 1
        first = tk.decode(tok, ids[:ends[0]])
        assert first == source.documents[0], f.name


def test_caches_are_reused_not_rebuilt(hub, tiny):
    ours = [tk.tokenizer_dir(hub.data_dir, tiny.corpus_hash, TINY_V),
            tokens_dir(hub.data_dir, tiny.corpus_hash, TINY_V)]
    def mtimes():
        return {p: p.stat().st_mtime_ns for d in ours for p in d.rglob("*") if p.is_file()}
    before = mtimes()
    again = DataHub(hub.data_dir).prepared(TINY_V)
    assert again.corpus_hash == tiny.corpus_hash
    assert mtimes() == before and len(before) == 2 + len(tiny.files)   # + meta.json
    assert again.build_s["tokens"] < 1.0


# A small corpus of the user's own (no embedded sources), for the tests that build its caches
# again and again: the embedded corpus takes seconds to tokenize, these milliseconds.
FOLDER_DOCS = {f"note{i}.txt": f"Note {i}: the loss fell from {9 - i}.{i} to {i}.5 at step "
               f"{100 * i}.\n" * (40 + 7 * i) for i in range(6)}
MINE = "Un texte à moi, écrit en français. " * 400


def small_hub(data_dir, tmp_path, *extra) -> DataHub:
    notes = tmp_path / "notes"
    if not notes.exists():
        notes.mkdir()
        for name, text in FOLDER_DOCS.items():
            (notes / name).write_text(text, encoding="utf-8")
    return DataHub(data_dir, (("notes", notes), *extra), only_corpus=True)


def test_corpus_change_gives_new_caches(tmp_path):
    base = small_hub(tmp_path / "data", tmp_path).prepared(TINY_V)
    mine = tmp_path / "mine.txt"
    mine.write_text(MINE, encoding="utf-8")
    changed = small_hub(tmp_path / "data", tmp_path, ("mine", mine)).prepared(TINY_V)
    assert changed.corpus_hash != base.corpus_hash
    assert changed.tokenizer_path != base.tokenizer_path
    assert changed.source_names == [*base.source_names, "mine"] == ["notes", "mine"]
    ids = np.asarray(changed.files[-1].tokens)
    assert tk.decode(changed.tokenizer, ids[:-1]) == MINE


def test_stale_token_file_is_rebuilt(tmp_path):
    first = small_hub(tmp_path / "data", tmp_path).prepared(TINY_V)
    want = np.array(first.files[0].tokens)
    tokenizer_written = first.tokenizer_path.stat().st_mtime_ns
    (token_file,) = tokens_dir(tmp_path / "data", first.corpus_hash, TINY_V).glob("000_*.u16")
    del first
    token_file.write_bytes(token_file.read_bytes()[:100])   # as if a crash cut it short
    rebuilt = small_hub(tmp_path / "data", tmp_path).prepared(TINY_V)
    assert rebuilt.tokenizer_path.stat().st_mtime_ns == tokenizer_written   # tokenizer reused
    assert np.array_equal(rebuilt.files[0].tokens, want)


@pytest.mark.parametrize("batch_chars", [1, 1000, tokens_module.ENCODE_CHUNK_CHARS])
def test_token_files_are_each_document_encoded_alone(tmp_path, monkeypatch, batch_chars):
    """Documents are encoded many to a batch: the file is still each document encoded on its
    own (the tokenizer's `encode`, a long document in its line-aligned pieces as before) and its
    end-of-text, in order, whether a batch ends between documents or inside one."""
    monkeypatch.setattr(tokens_module, "ENCODE_CHUNK_CHARS", batch_chars)
    monkeypatch.setattr(tokens_module, "PIECE_CHARS", 700)
    hub = small_hub(tmp_path / "data", tmp_path)
    got = hub.prepared(TINY_V)
    (source,) = got.sources
    assert len(source.documents) == len(FOLDER_DOCS) and max(map(len, source.documents)) > 1400
    want = []
    for doc in source.documents:
        want += [i for piece in tokens_module._pieces(doc)
                 for i in got.tokenizer.encode(piece, add_special_tokens=False).ids]
        want.append(got.tokenizer.token_to_id(tk.EOT))
    assert np.asarray(got.files[0].tokens).tolist() == want


def test_training_is_deterministic(tiny):
    fresh = tk.train_tokenizer(list(tiny.sources), TINY_V)
    assert fresh.to_str() == tiny.tokenizer_path.read_text(encoding="utf-8")


BUILD_CHILD = """
import sys
from pathlib import Path
from andrea.data import tokens
from andrea.data.hub import DataHub
built = tokens._build
def counted(*a, **k):
    print("built", flush=True)
    return built(*a, **k)
tokens._build = counted
corpus = DataHub(Path(sys.argv[1]), (("notes", Path(sys.argv[2])),), only_corpus=True)
print(len(corpus.prepared(int(sys.argv[3])).files[0].tokens), flush=True)
"""


def test_processes_that_start_together_build_a_cache_once(tmp_path):
    """Two processes asking for the same caches at once (`--workers`, servers sharing a cache):
    one builds them, the other waits on the lock beside them and reads what it wrote."""
    import fcntl
    import subprocess
    import sys

    hub = small_hub(tmp_path / "data", tmp_path)
    lock = tmp_path / "data" / "tokens" / f"{hub.corpus_hash()}_{TINY_V}.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)     # both children start while the lock is taken
        procs = [subprocess.Popen([sys.executable, "-c", BUILD_CHILD, str(tmp_path / "data"),
                                   str(tmp_path / "notes"), str(TINY_V)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        for p in procs:
            with pytest.raises(subprocess.TimeoutExpired):
                p.wait(timeout=1)            # waiting on the lock, however long it is held
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert sorted(len(o) for o in outs) == [1, 2]               # one built, one read
    assert outs[0][-1] == outs[1][-1] == str(len(hub.prepared(TINY_V).files[0].tokens))
