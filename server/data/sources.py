"""Corpus sources: named streams of text, each a list of documents.

The embedded default needs nothing but Python: the interpreter's documentation topics
(`pydoc_data.topics`, prose) and a capped, deterministic sample of the standard library's
source (code). User text comes from `andrea serve --corpus NAME=PATH` (a file, or a folder of
.txt/.md files). Every problem with user text is a CorpusError whose message names the path.

Documents are ordered by a hash of their name, so the held-out tail of each source's token
stream (the validation split, see tokens.py) is a fair sample of documents, not the last few
alphabetically.
"""

from __future__ import annotations

import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

STDLIB_CHAR_CAP = 2_500_000        # keeps the default corpus a few MB: builds in seconds on 2 cores
STDLIB_FILE_CAP = 100_000          # skip the few huge generated modules
# Tests, GUIs and vendored trees are noise or duplicates; site-packages is not the stdlib.
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3",
                    "turtledemo", "__pycache__", "ensurepip"}
USER_SUFFIXES = (".txt", ".md")
USER_CHAR_CAP = 200_000_000        # tokens are built in memory; beyond this, say so up front
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
MAX_SOURCES = 255                  # the batch header stores a row's source as one byte


class CorpusError(ValueError):
    """User-supplied corpus text is unusable; the message says which path and why."""


@dataclass(frozen=True)
class Source:
    name: str                      # shown in charts and the batch description
    kind: str                      # "docs" | "code" | "user"
    origin: str                    # where the text came from, for humans
    documents: tuple[str, ...]     # in stream order; token files put an end-of-text after each

    @property
    def n_chars(self) -> int:
        return sum(len(d) for d in self.documents)


def _by_name_hash(named: list[tuple[str, str]]) -> tuple[str, ...]:
    named.sort(key=lambda nd: hashlib.sha1(nd[0].encode()).hexdigest())
    return tuple(text for _, text in named)


def python_docs_source() -> Source:
    from pydoc_data.topics import topics
    return Source("python-docs", "docs", "pydoc_data.topics",
                  _by_name_hash([(k, v) for k, v in topics.items() if v.strip()]))


def _stdlib_files(root: Path) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_SKIP_DIRS and not d.startswith("config-")]
        rel = os.path.relpath(folder, root)
        found += [os.path.normpath(os.path.join(rel, f)) for f in files if f.endswith(".py")]
    return found


def python_stdlib_source(cap_chars: int = STDLIB_CHAR_CAP) -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    # A pseudo-random but reproducible sample: walk files in order of their path's hash.
    paths = sorted(_stdlib_files(root), key=lambda r: hashlib.sha1(r.encode()).hexdigest())
    named, total = [], 0
    for rel in paths:
        raw = (root / rel).read_bytes()
        if len(raw) > STDLIB_FILE_CAP or total + len(raw) > cap_chars:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            named.append((rel, text))
            total += len(text)
    return Source("python-stdlib", "code", str(root), _by_name_hash(named))


def default_sources() -> list[Source]:
    return [python_docs_source(), python_stdlib_source()]


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise CorpusError(f"{path}: looks binary (contains NUL bytes); give UTF-8 text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def user_source(name: str, path: Path) -> Source:
    """A file, or a folder whose .txt/.md files (recursively) become the documents."""
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
    named, total = [], 0
    for f in files:
        text = _read_text(f)
        total += len(text)
        if total > USER_CHAR_CAP:
            raise CorpusError(f"{path}: more than {USER_CHAR_CAP:,} characters; "
                              "give a smaller sample")
        if text.strip():               # an empty file inside a folder is skipped, not fatal
            named.append((str(f.relative_to(path)) if f != path else f.name, text))
    if not named:
        raise CorpusError(f"{path}: empty (no text in {len(files)} file(s))")
    return Source(name, "user", str(path.resolve()), _by_name_hash(named))


def parse_corpus_arg(arg: str) -> tuple[str, Path]:
    """`NAME=PATH` from the command line."""
    name, sep, path = arg.partition("=")
    if not sep or not name or not path:
        raise CorpusError(f"--corpus {arg!r}: expected NAME=PATH")
    return name, Path(path)


def load_sources(corpora: tuple[tuple[str, Path], ...] = ()) -> list[Source]:
    """The default sources followed by the user's, in the order given."""
    sources = default_sources()
    for name, path in corpora:
        if any(s.name == name for s in sources):
            raise CorpusError(f"corpus name {name!r} is used twice (names must be unique)")
        sources.append(user_source(name, path))
    if len(sources) > MAX_SOURCES:
        raise CorpusError(f"{len(sources)} sources; at most {MAX_SOURCES} are supported")
    return sources


def corpus_hash(sources: list[Source]) -> str:
    """Content hash of the whole corpus: names and text, so any change gives new caches."""
    h = hashlib.sha256()
    for s in sources:
        h.update(f"{s.name}\x00{len(s.documents)}\x00".encode())
        for d in s.documents:
            h.update(len(d).to_bytes(8, "little"))
            h.update(d.encode("utf-8"))
    return h.hexdigest()[:16]
