"""Tokenizer round trip, the browser's decode table, and the on-disk caches."""

from __future__ import annotations

import base64
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

from andrea.data import tokenizer as tk
from andrea.data.hub import DataHub
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


def test_decode_table_gives_utf8_bytes(tiny, data_client):
    body = data_client.get("/api/tokenizer/tiny").json()
    table = [base64.b64decode(b) for b in body["token_bytes_b64"]]
    assert len(table) == body["n_tokens"] == TINY_V and body["eot_id"] == 0
    assert table[0] == tk.EOT.encode() and sorted(table[1:257]) == [bytes([b]) for b in range(256)]
    for text in NON_ASCII:
        ids = tiny.tokenizer.encode(text).ids
        assert b"".join(table[i] for i in ids) == text.encode("utf-8")
    by_size = data_client.get("/api/tokenizer/512").json()
    assert by_size["token_bytes_b64"] == body["token_bytes_b64"]


def test_tokenizer_json_is_standard(tiny, data_client, tmp_path):
    r = data_client.get("/api/tokenizer/tiny/tokenizer.json")
    assert r.status_code == 200
    (tmp_path / "tokenizer.json").write_bytes(r.content)
    loaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = NON_ASCII[0]
    assert loaded.encode(text).ids == tiny.tokenizer.encode(text).ids
    assert data_client.get("/api/tokenizer/nope").status_code == 404
    assert data_client.get("/api/tokenizer/12").status_code == 404


def test_caches_are_reused_not_rebuilt(data_dir, tiny):
    mtimes = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}
    again = DataHub(data_dir).prepared(TINY_V)
    assert again.corpus_hash == tiny.corpus_hash
    assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()} == mtimes
    assert again.build_s["tokens"] < 1.0


def test_corpus_change_gives_new_caches(data_dir, tiny, tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("Un texte à moi, écrit en français. " * 400, encoding="utf-8")
    changed = DataHub(data_dir, (("mine", mine),)).prepared(TINY_V)
    assert changed.corpus_hash != tiny.corpus_hash
    assert changed.tokenizer_path != tiny.tokenizer_path
    assert changed.source_names == [*tiny.source_names, "mine"]
    ids = np.asarray(changed.files[-1].tokens)
    assert tk.decode(changed.tokenizer, ids[:-1]) == mine.read_text(encoding="utf-8")


def test_stale_token_file_is_rebuilt(data_dir, tiny, tmp_path):
    for part in ("tokenizers", "tokens"):          # a copy of the cache, no retraining
        shutil.copytree(data_dir / part, tmp_path / part)
    token_file = next((tmp_path / "tokens").glob(f"{tiny.corpus_hash}_{TINY_V}/000_*.u16"))
    token_file.write_bytes(token_file.read_bytes()[:100])   # as if a crash cut it short
    rebuilt = DataHub(tmp_path).prepared(TINY_V)
    assert rebuilt.build_s["tokenizer"] < 1.0                 # tokenizer reused
    assert np.array_equal(rebuilt.files[0].tokens, tiny.files[0].tokens)


def test_training_is_deterministic(tiny):
    fresh = tk.train_tokenizer(list(tiny.sources), TINY_V)
    assert fresh.to_str() == tiny.tokenizer_path.read_text(encoding="utf-8")
