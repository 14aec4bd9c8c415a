"""Corpus sources: named streams of text, each a list of documents.

The embedded default needs nothing but Python, and takes all of what every installation ships
that is real prose or code (nothing sampled, nothing capped):

    python-docs    prose: `pydoc_data.topics` (the language reference topics), IDLE's help page
                   (text of idlelib/help.html) and the .txt/.rst/.md files of the standard
                   library outside its tests (IDLE's NEWS and README, LICENSE, email's notes...)
    python-stdlib  code: every standard-library .py file outside tests (pydoc_data/topics.py is
                   the docs above, so it is left out)
    python-tests   code: every .py file of the standard library's test suites (Lib/test and the
                   packages' own test folders)
    python-bundled code: the .py files of the pip and setuptools wheels that CPython ships in
                   ensurepip/_bundled (read from the zip; absent where a distribution strips
                   them, which gives another corpus hash)

site-packages is not the stdlib. A text found twice is kept once, in the first source that has
it (see _dedup). Files that are not UTF-8 (a few test files are, on purpose)
or hold NUL bytes are skipped. User text comes from `andrea serve --corpus NAME=PATH` (a file,
or a folder of .txt/.md/.jsonl/.parquet files), after the embedded sources, or instead of them
with `--only-corpus` (then the tokenizer is trained on the user's text alone, and the corpus
hash is another). Every problem with user text is a CorpusError whose message names the path,
but one: a file of a folder that is not UTF-8 text (binary, another encoding) is skipped, and
`andrea serve` names it and why (corpus_summary, skipped_warnings).

Documents are ordered by a hash of their name, so the held-out documents of each source (the
validation split, see tokens.py) are a fair sample, not the last few alphabetically.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
import zipfile
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

# Folders that are not the standard library's own text.
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
# A folder with one of these names holds a test suite: its .py files go to python-tests.
TEST_DIRS = {"test", "tests", "idle_test"}
PROSE_SUFFIXES = (".txt", ".rst", ".md")
DOCS_MODULE_FILE = os.path.join("pydoc_data", "topics.py")   # the python-docs text, as code
HTML_DOCS = (os.path.join("idlelib", "help.html"),)
USER_SUFFIXES = (".txt", ".md", ".jsonl", ".parquet")
USER_CHAR_CAP = 200_000_000        # tokens are built in memory; beyond this, say so up front
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
MAX_SOURCES = 255                  # the batch header stores a row's source as one byte
# The tokenizer is trained on a deterministic sample of the corpus (tokenizer_sample): BPE
# merges converge long before 32 MB, and training on all of it would cost ~10x the time.
TOKENIZER_SAMPLE_CHARS = 3_000_000


class CorpusError(ValueError):
    """User-supplied corpus text is unusable; the message says which path and why."""


class NotText(CorpusError):
    """A user file that is not UTF-8 text (NUL bytes, or bytes UTF-8 cannot decode): fatal when
    the file is given itself, skipped with a warning inside a folder (user_source)."""

    def __init__(self, path: Path, why: str, advice: str = ""):
        super().__init__(f"{path}: {why}{advice}")
        self.path, self.why = path, why


@dataclass(frozen=True)
class Source:
    name: str                      # shown in charts and the batch description
    kind: str                      # "docs" | "code" | "user"
    origin: str                    # where the text came from, for humans
    documents: tuple[str, ...]     # in stream order; token files put an end-of-text after each
    files: int = 0                 # user text: the files read
    skipped: tuple[tuple[str, str], ...] = ()   # user text: (file, why) of each file left out

    @property
    def n_chars(self) -> int:
        return sum(len(d) for d in self.documents)


def _by_name_hash(named: list[tuple[str, str]]) -> tuple[str, ...]:
    named.sort(key=lambda nd: hashlib.sha1(nd[0].encode()).hexdigest())
    return tuple(text for _, text in named)


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: Path) -> list[str]:
    """Every file under the stdlib folder, relative, in sorted order (os.walk order varies)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_SKIP_DIRS and not d.startswith("config-")]
        rel = os.path.relpath(folder, root)
        found += [os.path.normpath(os.path.join(rel, f)) for f in files]
    return sorted(found)


def _is_test(rel: str) -> bool:
    return any(part in TEST_DIRS for part in Path(rel).parts[:-1])


def _utf8(raw: bytes) -> str | None:
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


class _HtmlText(HTMLParser):
    """The text of an HTML page (scripts and styles dropped), blank lines squeezed."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    def text(self) -> str:
        return re.sub(r"\n\s*\n(\s*\n)+", "\n\n", "".join(self.parts)).strip() + "\n"


def html_text(html: str) -> str:
    p = _HtmlText()
    p.feed(html)
    p.close()
    return p.text()


def python_docs_source() -> Source:
    from pydoc_data.topics import topics
    named = [(f"topic:{k}", v) for k, v in topics.items() if v.strip()]
    root = _stdlib_root()
    for rel in _stdlib_files(root):
        if rel.endswith(PROSE_SUFFIXES) and not _is_test(rel):
            text = _utf8((root / rel).read_bytes())
        elif rel in HTML_DOCS:
            text = _utf8((root / rel).read_bytes())
            text = html_text(text) if text is not None else None
        else:
            continue
        if text and text.strip():
            named.append((rel, text))
    return Source("python-docs", "docs", f"pydoc_data.topics + prose files under {root}",
                  _by_name_hash(named))


def _python_code(tests: bool) -> Source:
    root = _stdlib_root()
    named = []
    for rel in _stdlib_files(root):
        if not rel.endswith(".py") or rel == DOCS_MODULE_FILE or _is_test(rel) != tests:
            continue
        text = _utf8((root / rel).read_bytes())
        if text and text.strip():
            named.append((rel, text))
    return Source("python-tests" if tests else "python-stdlib", "code",
                  f"{root} ({'test suites' if tests else 'library'} .py files)",
                  _by_name_hash(named))


def python_stdlib_source() -> Source:
    return _python_code(tests=False)


def python_tests_source() -> Source:
    return _python_code(tests=True)


def python_bundled_source() -> Source | None:
    folder = _stdlib_root() / "ensurepip" / "_bundled"
    named = []
    for wheel in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for member in sorted(z.namelist()):
                if member.endswith(".py"):
                    text = _utf8(z.read(member))
                    if text and text.strip():
                        named.append((f"{wheel.name}/{member}", text))
    if not named:
        return None
    return Source("python-bundled", "code", f"{folder} (the pip and setuptools wheels' .py files)",
                  _by_name_hash(named))


def _dedup(sources: list[Source]) -> list[Source]:
    """Each text once in the whole corpus (the first in corpus order is kept): a file shipped
    twice (a test copy of a module, the same __init__.py in two wheels) would otherwise be
    trained on in one place and scored as held out in another."""
    seen: set[str] = set()
    out = []
    for s in sources:
        kept = []
        for d in s.documents:
            if d not in seen:
                seen.add(d)
                kept.append(d)
        out.append(replace(s, documents=tuple(kept)))
    return out


def default_sources() -> list[Source]:
    bundled = python_bundled_source()
    return _dedup([python_docs_source(), python_stdlib_source(), python_tests_source(),
                   *([bundled] if bundled else [])])


def tokenizer_sample(sources: list[Source],
                     chars: int = TOKENIZER_SAMPLE_CHARS) -> list[str]:
    """What the tokenizer is trained on: a deterministic sample of every source's documents,
    each source contributing in proportion to its size but at least min(its size, chars / (2K))
    characters, so a small source (prose) still gets its own merges. Documents are taken in
    stream order (name-hash order: a fair sample); a source that fits is taken whole."""
    total = sum(s.n_chars for s in sources)
    if total <= chars:
        return [_trainable(d) for s in sources for d in s.documents]
    floor = chars // (2 * len(sources))
    out = []
    for s in sources:
        budget = max(floor, chars * s.n_chars // total)
        taken = 0
        for d in s.documents:
            if taken >= budget:
                break
            out.append(_trainable(d[:chars]))   # (one document of a whole book: its start)
            taken += len(d)
    return out


LONG_RUN = 4096     # characters of one kind (word or punctuation) the tokenizer trains on at once
_LONG_RUNS = re.compile(rf"(\w{{{LONG_RUN}}}|[^\s\w]{{{LONG_RUN}}})(?=\S)")


def _trainable(doc: str) -> str:
    """`doc` as the tokenizer's trainer takes it: a run of one kind of character longer than
    LONG_RUN (a DNA sequence, a row of dashes) broken by a space every LONG_RUN characters. The
    BPE trainer's time grows with the square of a word's length: a 300,000-letter run took a
    minute, and a long one hung the server's first batch. (No run of the embedded corpus is
    near that long: its tokenizer is the same.)"""
    return _LONG_RUNS.sub(r"\1 ", doc) if len(doc) > LONG_RUN else doc


def _read_text(path: Path) -> str:
    try:
        if path.stat().st_size > 4 * USER_CHAR_CAP:   # (a UTF-8 character is at most 4 bytes)
            raise CorpusError(f"{path}: more than {USER_CHAR_CAP:,} characters; give a smaller "
                              "sample")
        raw = path.read_bytes()
    except OSError as e:            # unreadable (permissions, a dangling link): said, not raised
        raise CorpusError(f"{path}: cannot be read: {e.strerror or e}") from None
    if b"\x00" in raw:
        raise NotText(path, "looks binary (contains NUL bytes)", "; give UTF-8 text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise NotText(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _jsonl_documents(path: Path) -> list[tuple[str, str]]:
    """One document per line: the line's `text` field (a blank line is skipped)."""
    out = []
    for i, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise CorpusError(f"{path}: line {i} is not JSON ({e})") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise CorpusError(f"{path}: line {i} has no string field 'text'")
        out.append((f"{i}", text))
    return out


def _parquet_documents(path: Path) -> list[tuple[str, str]]:
    """One document per row: the `text` column (null rows are skipped). Needs pyarrow, which
    is optional: `pip install 'andrea[parquet]'`."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError(f"{path}: reading .parquet files needs pyarrow, which is not "
                          "installed: pip install 'andrea[parquet]' (or pip install pyarrow)"
                          ) from None
    try:
        table = pq.read_table(path, columns=["text"])
    except Exception as e:       # pyarrow raises its own types for a bad file or a missing column
        raise CorpusError(f"{path}: cannot read a 'text' column ({type(e).__name__}: {e})"
                          ) from None
    column = table.column("text")
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise CorpusError(f"{path}: column 'text' holds {column.type}, not strings")
    return [(f"{i}", t) for i, t in enumerate(column.to_pylist()) if t is not None]


def _documents(path: Path) -> list[tuple[str, str]]:
    """(name within the file, text) of each document a user file holds."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_documents(path)
    if suffix == ".parquet":
        return _parquet_documents(path)
    return [("", _read_text(path))]


def user_source(name: str, path: Path) -> Source:
    """A file, or a folder whose .txt/.md/.jsonl/.parquet files (recursively) give the
    documents: a .txt/.md file is one document, a .jsonl file one per line (its `text` field),
    a .parquet file one per row (its `text` column; needs the optional pyarrow).

    A file of a folder that is not UTF-8 text (binary, or another encoding) is skipped, and
    listed in the source's `skipped` with why (`andrea serve` warns of each); a folder left
    with no text, or such a file given itself, is a CorpusError."""
    if not NAME_RE.match(name):
        raise CorpusError(f"corpus name {name!r}: use 1-40 letters, digits, '.', '_' or '-'")
    path = Path(path).expanduser()
    if not path.exists():
        raise CorpusError(f"{path}: no such file or folder")
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and p.suffix.lower() in USER_SUFFIXES)
        if not files:
            raise CorpusError(f"{path}: folder holds no {'/'.join(USER_SUFFIXES)} files")
    else:
        raise CorpusError(f"{path}: neither a file nor a folder")
    named, total, skipped = [], 0, []
    for f in files:
        rel = str(f.relative_to(path)) if f != path else f.name
        try:
            documents = _documents(f)
        except NotText as e:
            if f == path:              # the file given itself: nothing else to serve
                raise
            skipped.append((rel, e.why))
            continue
        for part, text in documents:
            total += len(text)
            if total > USER_CHAR_CAP:
                raise CorpusError(f"{path}: more than {USER_CHAR_CAP:,} characters; "
                                  "give a smaller sample")
            if text.strip():           # an empty file or record is skipped, not fatal
                named.append((f"{rel}:{part}" if part else rel, text))
    if not named:
        left_out = (f"; skipped: {_listed(skipped)}" if skipped else "")
        raise CorpusError(f"{path}: empty (no text in {len(files)} file(s){left_out})")
    return Source(name, "user", str(path.resolve()), _by_name_hash(named),
                  files=len(files) - len(skipped), skipped=tuple(skipped))


def _listed(skipped) -> str:
    return ", ".join(f"{rel} ({why})" for rel, why in skipped)


def corpus_summary(sources: list[Source]) -> str:
    """The line `andrea serve` prints at start: each source with its characters, and for user
    text the files read and those skipped (skipped_warnings says why, one line each)."""
    def one(s: Source) -> str:
        read = f" from {s.files:,} file{'s' * (s.files != 1)}" if s.kind == "user" else ""
        left_out = (f"; skipped {len(s.skipped)}: {', '.join(rel for rel, _ in s.skipped)}"
                    if s.skipped else "")
        return f"{s.name} ({s.n_chars:,} chars{read}{left_out})"
    return "Andrea: corpus " + ", ".join(one(s) for s in sources)


def skipped_warnings(sources: list[Source]) -> list[str]:
    """One warning line per user file left out of its folder's source, naming it and why."""
    return [f"Andrea: warning: corpus {s.name!r}: skipped {Path(s.origin) / rel}: {why}; "
            "it is not served (convert it to UTF-8 text to train on it)"
            for s in sources for rel, why in s.skipped]


def parse_corpus_arg(arg: str) -> tuple[str, Path]:
    """`NAME=PATH` from the command line."""
    name, sep, path = arg.partition("=")
    if not sep or not name or not path:
        raise CorpusError(f"--corpus {arg!r}: expected NAME=PATH")
    return name, Path(path)


def load_sources(corpora: tuple[tuple[str, Path], ...] = (),
                 include_default: bool = True) -> list[Source]:
    """The default sources followed by the user's, in the order given; the user's alone when
    include_default is False (`andrea serve --only-corpus`), which needs at least one."""
    if not include_default and not corpora:
        raise CorpusError("--only-corpus (ANDREA_ONLY_CORPUS) serves only your own text: give "
                          "at least one --corpus NAME=PATH")
    sources = default_sources() if include_default else []
    for name, path in corpora:
        if any(s.name == name for s in sources):
            raise CorpusError(f"corpus name {name!r} is used twice (names must be unique)")
        sources.append(user_source(name, path))
    if len(sources) > MAX_SOURCES:
        raise CorpusError(f"{len(sources)} sources; at most {MAX_SOURCES} are supported")
    # A document once, in its first source: a copy (a .jsonl's repeated record, a folder given
    # twice, a vendored stdlib module) would be trained on in one source's windows and held out
    # in another's, and the eval loss would measure what was learnt by heart.
    deduped = _dedup(sources)
    for s, d in zip(sources, deduped):
        if not d.documents:
            raise CorpusError(f"corpus {s.name!r}: every document of it is already in an "
                              "earlier source")
    return deduped


def corpus_hash(sources: list[Source]) -> str:
    """Content hash of the whole corpus: names and text, so any change gives new caches."""
    h = hashlib.sha256()
    for s in sources:
        h.update(f"{s.name}\x00{len(s.documents)}\x00".encode())
        for d in s.documents:
            h.update(len(d).to_bytes(8, "little"))
            h.update(d.encode("utf-8"))
    return h.hexdigest()[:16]
