"""DataHub: the corpus of this server, and its tokenizer + token files per vocabulary size.

Nothing is read or built until first asked for (tests and page loads stay fast); each vocab
size is prepared once per process under its own lock, from the on-disk caches when present, and
built by one process at a time (a file lock beside the caches): the processes of `andrea serve
--workers N`, or servers sharing ANDREA_CACHE_DIR, that start together tokenize the corpus once,
the others waiting for it and then reading it. `andrea serve` warms the presets' vocab sizes in
a background thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from andrea.data import tokenizer as tk
from andrea.data.sources import Source, corpus_hash, load_sources
from andrea.data.tokens import VAL_FRACTION, TokenFile, load_or_build

try:
    import fcntl
except ImportError:      # (not POSIX: each process builds what it finds missing, as before)
    fcntl = None


@dataclass(frozen=True)
class PreparedCorpus:
    corpus_hash: str
    vocab_size: int                 # V asked for (the tokenizer may hold fewer tokens, never more)
    tokenizer: Tokenizer
    tokenizer_path: Path
    files: tuple[TokenFile, ...]    # corpus order
    sources: tuple[Source, ...]
    build_s: dict = field(default_factory=dict)   # {"waited", "tokenizer", "tokens": s} here

    @property
    def source_names(self) -> list[str]:
        return [f.name for f in self.files]

    def describe(self) -> dict:
        return {
            "corpus_hash": self.corpus_hash, "vocab_size": self.vocab_size,
            "tokenizer_tokens": self.tokenizer.get_vocab_size(), "val_fraction": VAL_FRACTION,
            "sources": [{"index": i, "name": f.name, "kind": s.kind, "origin": s.origin,
                         "chars": s.n_chars, "documents": len(s.documents), "tokens": f.n_tokens,
                         "train_tokens": f.n_train, "val_tokens": f.n_val,
                         "chars_per_token": round(s.n_chars / max(f.n_tokens, 1), 3)}
                        for i, (f, s) in enumerate(zip(self.files, self.sources))],
        }


class DataHub:
    def __init__(self, data_dir: Path, corpora: tuple[tuple[str, Path], ...] = (),
                 only_corpus: bool = False):
        self.data_dir = Path(data_dir)
        self.corpora = tuple(corpora)
        self.only_corpus = only_corpus      # the user's sources alone, no embedded ones
        self._sources: list[Source] | None = None
        self._hash = ""
        self._prepared: dict[int, PreparedCorpus] = {}
        self._lock = threading.Lock()
        self._vocab_locks: dict[int, threading.Lock] = {}

    def sources(self) -> list[Source]:
        with self._lock:
            if self._sources is None:
                # CorpusError names the bad path
                self._sources = load_sources(self.corpora, include_default=not self.only_corpus)
                self._hash = corpus_hash(self._sources)
            return self._sources

    def corpus_hash(self) -> str:
        self.sources()
        return self._hash

    def ready(self, vocab_size: int) -> PreparedCorpus | None:
        """The prepared corpus of this vocab size if it is made already (the start's warm-up
        makes the presets'), else None: never builds."""
        return self._prepared.get(vocab_size)

    def prepared(self, vocab_size: int) -> PreparedCorpus:
        if vocab_size in self._prepared:
            return self._prepared[vocab_size]
        sources = self.sources()
        with self._lock:
            lock = self._vocab_locks.setdefault(vocab_size, threading.Lock())
        with lock:
            if vocab_size not in self._prepared:
                t0 = time.perf_counter()
                with self._build_lock(vocab_size):
                    t1 = time.perf_counter()
                    tok, tok_path = tk.load_or_train(self.data_dir, sources, self._hash,
                                                     vocab_size)
                    t2 = time.perf_counter()
                    files, _ = load_or_build(self.data_dir, self._hash, vocab_size, tok,
                                             tok_path, sources)
                t3 = time.perf_counter()
                self._prepared[vocab_size] = PreparedCorpus(
                    self._hash, vocab_size, tok, tok_path, tuple(files), tuple(sources),
                    {"waited": round(t1 - t0, 3), "tokenizer": round(t2 - t1, 3),
                     "tokens": round(t3 - t2, 3)})
        return self._prepared[vocab_size]

    @contextlib.contextmanager
    def _build_lock(self, vocab_size: int):
        """Held while this process loads or builds the caches of (corpus, vocab size): another
        process building them meanwhile is waited for (flock: freed however it ends)."""
        if fcntl is None:
            yield
            return
        folder = self.data_dir / "tokens"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{self._hash}_{vocab_size}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield        # closing the file releases the lock

    def context_warning(self) -> str | None:
        """`andrea serve`'s warning when the corpus cannot give a training and a held-out row of
        the largest preset's context (windows.rows_problem; runs of such a context are refused
        at POST /api/runs), naming the presets that still fit; None when it can."""
        from andrea.data.spec import BatchSpec
        from andrea.data.windows import rows_problem
        from andrea.model import PRESETS

        def problem(cfg) -> str | None:
            spec = BatchSpec(seed=0, batch_size=1, seq_len=cfg.seq_len,
                             vocab_size=cfg.vocab_size, total_steps=1)
            return rows_problem(self.prepared(cfg.vocab_size).files, spec)

        by_context = sorted(PRESETS.items(), key=lambda kv: kv[1].seq_len)
        name, largest = by_context[-1]
        why = problem(largest)
        if why is None:
            return None
        fit = [n for n, cfg in by_context[:-1] if problem(cfg) is None]
        return (f"Andrea: warning: the corpus is too small for preset {name}'s context of "
                f"{largest.seq_len:,} tokens: {why}. Runs that ask for such a context are "
                "refused (422); " + (f"presets that fit: {', '.join(fit)}" if fit else
                                     "no preset's context fits"))

    def warm(self, vocab_sizes) -> threading.Thread:
        """Prepare these vocab sizes in the background so the first batch is served at once;
        then print context_warning's line if the corpus is too small for the largest preset."""
        def run():
            failed = False
            for v in sorted(set(vocab_sizes)):
                try:
                    self.prepared(v)
                except Exception as e:  # the request that needs it will report the error
                    print(f"Andrea: preparing data for vocab {v} failed: {e}", flush=True)
                    failed = True
            if failed:
                return
            try:
                if why := self.context_warning():
                    print(why, flush=True)
            except Exception as e:
                print(f"Andrea: checking the corpus against the presets failed: {e}",
                      flush=True)
        thread = threading.Thread(target=run, name="andrea-data-warm", daemon=True)
        thread.start()
        return thread
