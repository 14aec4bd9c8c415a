"""Corpus sources: the embedded default, user text, and clear errors for bad user text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from andrea.cli import main
from andrea.data.sources import (
    TOKENIZER_SAMPLE_CHARS,
    CorpusError,
    Source,
    corpus_hash,
    default_sources,
    load_sources,
    parse_corpus_arg,
    tokenizer_sample,
    user_source,
)


def test_default_corpus_is_all_the_text_python_ships():
    sources = default_sources()
    names = [s.name for s in sources]
    assert names[:3] == ["python-docs", "python-stdlib", "python-tests"]
    assert names[3:] in ([], ["python-bundled"])       # a distribution may strip the wheels
    assert [s.kind for s in sources] == ["docs"] + ["code"] * (len(sources) - 1)
    for s in sources:
        assert s.n_chars > 500_000 and all(d.strip() for d in s.documents), s.name
    texts = [d for s in sources for d in s.documents]
    assert len(set(texts)) == len(texts)             # each text once: no train/val twins
    # The whole stdlib (~30 MB of .py here): nothing capped, nothing sampled.
    assert sum(s.n_chars for s in sources[1:3]) > 20_000_000
    docs = sources[0].documents
    assert any("The \"if\" statement" in d for d in docs)            # a pydoc topic
    assert any(d.startswith("IDLE") or "IDLE" in d[:200] for d in docs)  # shipped prose files
    assert not any("<html" in d.lower() for d in docs)                  # help.html as text
    code = set(sources[1].documents)
    assert not code & set(sources[2].documents)                         # tests apart
    from pydoc_data import topics
    assert Path(topics.__file__).read_text(encoding="utf-8") not in code   # docs, not code


def test_default_corpus_is_deterministic():
    a, b = default_sources(), default_sources()
    assert corpus_hash(a) == corpus_hash(b)
    assert [s.documents for s in a] == [s.documents for s in b]


def test_tokenizer_sample_is_deterministic_and_covers_every_source():
    sources = default_sources()
    sample = tokenizer_sample(sources)
    assert sample == tokenizer_sample(sources)
    size = sum(map(len, sample))
    assert TOKENIZER_SAMPLE_CHARS <= size < 1.5 * TOKENIZER_SAMPLE_CHARS
    taken = set(sample)
    for s in sources:                   # every source contributes, its first documents first
        assert s.documents[0] in taken, s.name
    small = [Source("a", "user", "", ("x" * 10, "y" * 10))]
    assert tokenizer_sample(small, chars=100) == ["x" * 10, "y" * 10]   # fits: all of it


def test_user_file_and_folder(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("Bonjour, où est la bibliothèque ?\n", encoding="utf-8")
    assert user_source("notes", f).documents == ("Bonjour, où est la bibliothèque ?\n",)

    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.md").write_text("# A\n")
    (folder / "sub" / "b.txt").write_text("b text\n")
    (folder / "ignored.py").write_text("print('not a text source')\n")
    (folder / "empty.txt").write_text("")          # skipped inside a folder
    s = user_source("books", folder)
    assert sorted(s.documents) == ["# A\n", "b text\n"]


def test_jsonl_gives_a_document_per_line(tmp_path):
    f = tmp_path / "records.jsonl"
    lines = [{"text": "première ligne"}, {"text": "second", "id": 2}, {"text": ""}, {"text": "3"}]
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in lines) + "\n\n",
                 encoding="utf-8")
    s = user_source("recs", f)
    assert sorted(s.documents) == ["3", "première ligne", "second"]   # empty text skipped
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.txt").write_text("plain\n")
    f.rename(folder / "r.jsonl")
    assert sorted(user_source("mixed", folder).documents) == [
        "3", "plain\n", "première ligne", "second"]
    assert user_source("mixed", folder).documents == user_source("mixed", folder).documents


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\nnot json\n', "line 2 is not JSON"),
    ('{"body": "no text field"}\n', "line 1 has no string field 'text'"),
    ('{"text": 3}\n', "line 1 has no string field 'text'"),
    ('["text"]\n', "line 1 has no string field 'text'"),
])
def test_bad_jsonl_is_a_clear_error(tmp_path, content, message):
    f = _write(tmp_path / "bad.jsonl", content.encode())
    with pytest.raises(CorpusError, match=message) as e:
        user_source("bad", f)
    assert str(f) in str(e.value)


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)          # as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    f = _write(tmp_path / "t.parquet", b"PAR1")
    with pytest.raises(CorpusError, match=r"needs pyarrow.*andrea\[parquet\]") as e:
        user_source("pq", f)
    assert str(f) in str(e.value)


def test_parquet_gives_a_document_per_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["un", None, "deux", ""], "n": [1, 2, 3, 4]}), f)
    assert sorted(user_source("rows", f).documents) == ["deux", "un"]
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "no_text.parquet")
    with pytest.raises(CorpusError, match="'text' column"):
        user_source("x", tmp_path / "no_text.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(CorpusError, match="not strings"):
        user_source("x", tmp_path / "ints.parquet")


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.txt", "no such file or folder"),
    (lambda p: _write(p / "empty.txt", b"  \n"), "empty"),
    (lambda p: _write(p / "blob.txt", b"abc\x00\x01\x02"), "binary"),
    (lambda p: _write(p / "latin1.txt", "café".encode("latin-1")), "not UTF-8"),
    (lambda p: _mkdir(p / "nothing"), "no .txt/.md/.jsonl/.parquet files"),
])
def test_bad_user_text_is_a_clear_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CorpusError, match=message) as e:
        user_source("mine", path)
    assert str(path) in str(e.value)


def test_bad_names_and_arguments(tmp_path):
    good = _write(tmp_path / "t.txt", b"text\n")
    with pytest.raises(CorpusError, match="corpus name"):
        user_source("no spaces", good)
    with pytest.raises(CorpusError, match="used twice"):
        load_sources((("python-docs", good),))
    with pytest.raises(CorpusError, match="NAME=PATH"):
        parse_corpus_arg("just-a-path")
    assert parse_corpus_arg("mine=/x/y=z.txt")[0] == "mine"


def test_serve_refuses_bad_corpus_at_start(tmp_path, capsys):
    code = main(["serve", "--data-dir", str(tmp_path), "--corpus", f"mine={tmp_path / 'nope'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error" in err and "nope" in err and "no such file" in err
    assert main(["serve", "--data-dir", str(tmp_path), "--corpus", "oops"]) == 2
    assert "NAME=PATH" in capsys.readouterr().err


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _mkdir(path):
    path.mkdir()
    return path
