"""Corpus sources: the embedded default, user text, and clear errors for bad user text."""

from __future__ import annotations

import pytest

from andrea.cli import main
from andrea.data.sources import (
    CorpusError,
    corpus_hash,
    default_sources,
    load_sources,
    parse_corpus_arg,
    user_source,
)


def test_default_corpus_has_two_kinds_of_text():
    sources = default_sources()
    assert [s.name for s in sources] == ["python-docs", "python-stdlib"]
    assert {s.kind for s in sources} == {"docs", "code"}
    for s in sources:
        assert s.n_chars > 100_000 and all(d.strip() for d in s.documents), s.name
    assert sum(s.n_chars for s in sources) < 4_000_000   # a few MB: builds in seconds


def test_default_corpus_is_deterministic():
    assert corpus_hash(default_sources()) == corpus_hash(default_sources())


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


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.txt", "no such file or folder"),
    (lambda p: _write(p / "empty.txt", b"  \n"), "empty"),
    (lambda p: _write(p / "blob.txt", b"abc\x00\x01\x02"), "binary"),
    (lambda p: _write(p / "latin1.txt", "café".encode("latin-1")), "not UTF-8"),
    (lambda p: _mkdir(p / "nothing"), "no .txt/.md files"),
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
