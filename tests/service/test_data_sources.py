"""Corpus sources: the embedded default, user text, and clear errors for bad user text."""

from __future__ import annotations

import json
import sys
import sysconfig
import time
from pathlib import Path

import pytest

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
        assert s.n_chars > 100_000 and all(d.strip() for d in s.documents), s.name
    texts = [d for s in sources for d in s.documents]
    assert len(set(texts)) == len(texts)             # each text once: no train/val twins
    # Nothing capped, nothing sampled: every .py file this interpreter ships, counted here by a
    # plain walk (a distribution may leave parts out: Debian's python3 has ~10 MB of stdlib code
    # and a few test files, python.org's ~30 MB and the whole test suite).
    root = Path(sysconfig.get_paths()["stdlib"])
    py = [p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts)
          and not any(part.startswith("config-") for part in p.relative_to(root).parts)]
    tests = [p for p in py if {"test", "tests", "idle_test"} & set(p.relative_to(root).parts[:-1])]
    def texts(paths):     # what a source keeps of a file: UTF-8 text, no NUL, not blank
        out = set()
        for p in paths:
            raw = p.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if b"\0" not in raw and text.strip():
                out.add(text)
        return out

    seen = set(sources[0].documents)
    code = [p for p in py if p not in tests
            and p.relative_to(root).as_posix() != "pydoc_data/topics.py"]   # python-docs
    for paths, source in [(code, sources[1]), (tests, sources[2])]:
        assert set(source.documents) == texts(paths) - seen, source.name
        seen |= set(source.documents)
    docs = sources[0].documents
    assert any("The \"if\" statement" in d for d in docs)            # a pydoc topic
    if (root / "idlelib" / "help.html").exists():                       # shipped prose files
        assert any(d.startswith("IDLE") or "IDLE" in d[:200] for d in docs)
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


# ---- --only-corpus: the user's text alone ----------------------------------------------------

WORDS = ("river stone lantern quiet harbour morning letter garden window silver orchard bell "
         "meadow candle thread compass anchor feather winter market").split()


def user_corpus(folder: Path, name: str = "notes", docs: int = 40, seed: int = 0) -> Path:
    """A folder of `docs` small .txt documents of plain words, each with the rare word
    'zyzzyva' (which a tokenizer trained on this text alone learns as one token)."""
    import random

    rng = random.Random(f"{name}-{seed}")
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        words = [rng.choice(WORDS) for _ in range(90)] + ["zyzzyva"] * 8
        rng.shuffle(words)
        (folder / f"{name}-{i:03d}.txt").write_text(" ".join(words) + ".\n", encoding="utf-8")
    return folder


def test_only_corpus_sources_are_the_users_alone(tmp_path):
    mine = (("notes", user_corpus(tmp_path / "notes")),)
    alone = load_sources(mine, include_default=False)
    assert [s.name for s in alone] == ["notes"] and alone[0].kind == "user"
    assert corpus_hash(alone) != corpus_hash(load_sources(mine))      # another corpus
    assert tokenizer_sample(alone) == list(alone[0].documents)         # trained on it alone
    with pytest.raises(CorpusError, match="at least one --corpus"):
        load_sources((), include_default=False)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _mkdir(path):
    path.mkdir()
    return path


# ---- user corpora: no leak into validation, no hang, no unbounded memory ------------------------


def _documents_of(tokens) -> set[tuple[int, ...]]:
    """The whole documents (token tuples; 0 is the end-of-text) of a stretch of a token file."""
    import numpy as np

    out, cur = set(), []
    for t in np.asarray(tokens).tolist():
        if t == 0:
            out.add(tuple(cur))
            cur = []
        else:
            cur.append(t)
    return out


def test_a_document_given_twice_is_trained_on_or_held_out_not_both(tmp_path):
    """A .jsonl with every record twice (scraped text; a folder given twice): held-out
    documents were also training documents, so the eval loss measured what was learnt by
    heart. A document now counts once, in its first source; a source with nothing else is
    refused."""
    from andrea.data.hub import DataHub
    from andrea.data.sources import CorpusError, load_sources

    lines = [json.dumps({"text": f"record {i}: the quick brown fox {i * 7919} jumps over."})
             for i in range(200)]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "data.jsonl").write_text("\n".join(lines + lines) + "\n")
    f = DataHub(tmp_path / "d", corpora=(("mine", tmp_path / "c"),),
                only_corpus=True).prepared(512).files[0]
    assert not _documents_of(f.tokens[f.n_train:]) & _documents_of(f.tokens[:f.n_train])
    with pytest.raises(CorpusError, match="already in an earlier source"):
        load_sources((("a", tmp_path / "c"), ("b", tmp_path / "c")), include_default=False)


def test_a_long_document_after_short_ones_is_cut_for_validation(tmp_path):
    """The document boundary nearest to 90% of a README and a book was the README's end: the
    whole book was held out, and the source got no training rows at all."""
    import hashlib

    from andrea.data.hub import DataHub
    from andrea.data.tokens import VAL_FRACTION

    d = tmp_path / "c"
    d.mkdir()
    (d / "README.md").write_text("Notes.\n")
    top = hashlib.sha1(b"README.md").hexdigest()     # the book after it in name-hash order
    book = next(n for n in (f"book{i}.txt" for i in range(1000))
                if hashlib.sha1(n.encode()).hexdigest() > top)
    (d / book).write_text("It was the best of times, it was the worst of times. " * 4000)
    f = DataHub(tmp_path / "d", corpora=(("mine", d),), only_corpus=True).prepared(512).files[0]
    assert abs(f.n_val / f.n_tokens - VAL_FRACTION) < 0.01, (f.n_train, f.n_tokens)


def test_the_tokenizer_trains_on_a_bounded_sample_of_any_text():
    """One 30 MB document was trained on whole (2.9 GB of memory; at the 200M-character cap,
    more than a machine has); a 200,000-letter run (a DNA sequence) took the BPE trainer
    minutes (its time grows with the square of a word's length), with the first batch waiting."""
    import numpy as np

    from andrea.data.sources import TOKENIZER_SAMPLE_CHARS, Source, tokenizer_sample
    from andrea.data.tokenizer import train_tokenizer

    sample = tokenizer_sample([Source("one", "user", "x", ("word " * 6_000_000,))])
    assert sum(map(len, sample)) <= TOKENIZER_SAMPLE_CHARS
    dna = "".join(np.random.default_rng(0).choice(list("acgt"), 200_000))
    t0 = time.process_time()
    train_tokenizer([Source("dna", "user", "x", (dna,))], 512)
    assert time.process_time() - t0 < 20        # (minutes before; about a second now)


def test_a_file_past_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """Its size says so: a file larger than memory was read whole first, and the server died."""
    from andrea.data import sources

    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(4 * sources.USER_CHAR_CAP + 1)   # sparse: no disk used
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read before the check"))
    with pytest.raises(sources.CorpusError, match="more than 200,000,000 characters"):
        sources.user_source("big", big)


def test_text_that_spells_the_end_of_text_token_is_text(tmp_path):
    """A corpus about language models mentions '<|endoftext|>': it was encoded as the special
    token, a document boundary in the middle of a document."""
    import numpy as np

    from andrea.data.hub import DataHub

    d = tmp_path / "c"
    d.mkdir()
    for i in range(20):
        (d / f"{i}.md").write_text(f"Doc {i}: GPT-2 ends documents with <|endoftext|> tokens.\n")
    f = DataHub(tmp_path / "d", corpora=(("mine", d),), only_corpus=True).prepared(512).files[0]
    assert int((np.asarray(f.tokens) == 0).sum()) == 20      # one end-of-text per document


def test_a_damaged_tokenizer_is_trained_again_and_an_unreadable_file_is_said(tmp_path,
                                                                            monkeypatch):
    """A tokenizer.json a machine's crash left empty broke every request for good; now it is
    trained again (the same bytes). A file that cannot be read is a CorpusError, not a
    traceback at start."""
    from andrea.data import sources
    from andrea.data.hub import DataHub

    (tmp_path / "c").mkdir()
    for i in range(30):
        (tmp_path / "c" / f"{i}.txt").write_text(f"document {i}: " + "some words here. " * 40)
    corpora = (("mine", tmp_path / "c"),)
    first = DataHub(tmp_path / "d", corpora=corpora, only_corpus=True).prepared(512)
    whole = first.tokenizer_path.read_bytes()
    first.tokenizer_path.write_bytes(b"")
    again = DataHub(tmp_path / "d", corpora=corpora, only_corpus=True).prepared(512)
    assert again.tokenizer_path.read_bytes() == whole
    assert [f.n_tokens for f in again.files] == [f.n_tokens for f in first.files]

    def denied(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(sources.CorpusError, match="cannot be read: Permission denied"):
        sources.user_source("mine", tmp_path / "c")


# ---- the corpus checked at serve time: text that is not UTF-8, a corpus too small for a run ----


def _folder_with_bad_files(folder: Path, docs: int = 3) -> Path:
    """A folder of `docs` good text files, a binary file and a latin-1 one."""
    user_corpus(folder, "good", docs=docs)
    _write(folder / "blob.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (folder / "sub").mkdir()
    _write(folder / "sub" / "latin1.md", "Crème brûlée, café.\n".encode("latin-1"))
    return folder


def test_a_folder_skips_a_binary_and_a_latin1_file_and_names_them(tmp_path):
    """One file that is not UTF-8 text used to refuse the whole folder; now it is left out, the
    rest is served, and the source says which files it skipped and why."""
    from andrea.data.sources import corpus_summary, skipped_warnings

    folder = _folder_with_bad_files(tmp_path / "mixed")
    s = user_source("mixed", folder)
    assert len(s.documents) == 3 and s.files == 3
    assert [rel for rel, _ in s.skipped] == ["blob.txt", str(Path("sub", "latin1.md"))]
    assert "binary" in s.skipped[0][1] and "not UTF-8" in s.skipped[1][1]
    assert s.documents == user_source("mixed", user_corpus(tmp_path / "clean", "good",
                                                           docs=3)).documents
    summary = corpus_summary([s])
    assert summary.startswith("Andrea: corpus mixed (") and "from 3 files" in summary
    assert "skipped 2: blob.txt, " in summary and "latin1.md" in summary
    warned = skipped_warnings([s])
    assert len(warned) == 2
    assert str(folder / "blob.txt") in warned[0] and "binary" in warned[0]
    assert str(folder / "sub" / "latin1.md") in warned[1] and "not UTF-8" in warned[1]
    # Nothing but such files: still an error, which names them.
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    _write(only_bad / "blob.txt", b"\x00\x01")
    with pytest.raises(CorpusError, match=r"empty .*skipped: blob.txt \(looks binary"):
        user_source("bad", only_bad)


def test_the_shape_check_is_what_the_batch_draw_needs():
    """rows_problem says None exactly when every training and validation batch can be drawn."""
    import itertools

    import numpy as np

    from andrea.data.spec import BatchSpec
    from andrea.data.tokens import TokenFile
    from andrea.data.windows import rows_problem, sample_batch

    T = 8
    sizes = [(0, 0), (8, 8), (9, 8), (8, 9), (9, 9), (30, 3), (3, 30)]
    for (a, b), picks, mode in itertools.product(itertools.product(sizes, repeat=2),
                                                 [(), ("a",), ("b",), ("a", "b")],
                                                 ["uniform", "fixed", "bandit"]):
        files = [TokenFile(name, np.arange(n + v, dtype=np.uint16), n)
                 for name, (n, v) in zip("ab", (a, b))]
        spec = BatchSpec(seed=1, batch_size=4, seq_len=T, vocab_size=512, total_steps=10,
                         mode=mode, weights=(0.0, 1.0) if mode == "fixed" else (),
                         sources=picks)
        why = rows_problem(files, spec)
        weights = np.ones(2) if mode == "bandit" else None
        try:
            for step in range(3):
                sample_batch(files, spec, step, "train", weights)
                sample_batch(files, spec, step, "val")
            served = True
        except ValueError:
            served = False
        if why is None:
            assert served, (a, b, picks, mode)
        elif not picks:      # (a picked source too short is refused though the draw would
            assert not served, (a, b, picks, mode, why)   # skip it: its rows silently go)
        if why:
            assert f"{T + 1} tokens" in why
