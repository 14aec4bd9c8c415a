"""Runs, their step metrics and events, and revoked write tokens, in SQLite (WAL, a file in the
data dir: the embedded default) or PostgreSQL (ANDREA_DATABASE_URL: several server processes
share it). One code path through SQLAlchemy Core: the tables are defined once (schema.py), the
SQL is what both understand; only the locking (BEGIN IMMEDIATE / SELECT ... FOR UPDATE) and the
row source of Metrics.add's INSERT differ. An older database gains the columns it lacks when it
opens. All I/O runs on the store's threads (one writer for SQLite, a small pool for
PostgreSQL), never on the event loop; the PRIMARY KEY (run_id, step) makes a resent record a
no-op (Metrics.add returns the rows it really inserted: what viewers are sent). Each run's row
carries its summary (last step and loss, times, eval losses), kept in step with its records,
so listing runs never reads records. Readers of a whole run page through it (Metrics.page,
Metrics.page_json, Events.page): nothing holds a big run in memory at once. A full disk, a
read-only data dir, a database that cannot be opened or a PostgreSQL server out of reach raise
StoreUnavailable with the reason and the path or URL (API: 503; trainer: close 1013).

The Store holds the database and its repositories, each a class given the database (but
Summaries: it works inside its callers' transactions) and the repositories it builds on, never
reaching into another's private members:

  engine.py   Database: connections, transactions (tx, lock_run), the store's threads (run:
              the methods marked @reads go to the reader threads), StoreUnavailable
  schema.py   the tables; Schema: creating them, and migrating an older database
  run_rows.py Runs (store.runs): create, read, list, rename, delete, status, tokens, resume,
              branch
  summary.py  Summaries (store.summaries): the run summary on the run's row, updated with each
              batch, recomputed
  metrics.py  Metrics (store.metrics): step records: batches, the group commit, pages
  events.py   Events (store.events): samples, phases, resumes
"""

from __future__ import annotations

from pathlib import Path

from andrea.store.engine import (
    PG_WORKERS,
    Database,
    StoreUnavailable,
    engine_url,
    reads,
    unavailable,
)
from andrea.store.events import Events
from andrea.store.metrics import GROUP_COMMIT_MAX, Metrics
from andrea.store.run_rows import Runs
from andrea.store.schema import COUNTERS, EVENTS, META, METRICS, REVOKED, RUNS, Schema
from andrea.store.summary import Summaries

__all__ = ["COUNTERS", "EVENTS", "GROUP_COMMIT_MAX", "META", "METRICS", "PG_WORKERS", "REVOKED",
           "RUNS", "Database", "Events", "Metrics", "Runs", "Schema", "Store",
           "StoreUnavailable", "Summaries", "engine_url", "reads", "unavailable"]


class Store:
    """The store: Store(path) for SQLite, Store(url=...) for PostgreSQL, Store.open(settings'
    database URL or None, the SQLite path) to pick. Its repositories' methods do blocking I/O:
    call them through `await store.run(store.runs.get, run_id)` on the event loop (the ones
    marked @reads go to the reader threads). Opening makes the database current (Schema)."""

    def __init__(self, path: Path | None = None, *, url: str | None = None):
        self.db = Database(path, url=url)
        self.summaries = Summaries()
        self.schema = Schema(self.db, self.summaries)
        self.events = Events(self.db)
        self.runs = Runs(self.db, self.summaries, self.events)
        self.metrics = Metrics(self.db, self.summaries)
        self.db.start(self.schema.migrate)

    @classmethod
    def open(cls, database_url: str | None, sqlite_path: Path) -> Store:
        """PostgreSQL at `database_url` (settings.database_url) when set, else the SQLite file
        at `sqlite_path`."""
        return cls(url=database_url) if database_url else cls(sqlite_path)

    async def run(self, fn, *args):
        """`fn` (a repository's method) on the store's threads, off the event loop: Database.run
        (one marked @reads on the reader threads)."""
        return await self.db.run(fn, *args)

    def close(self) -> None:
        """Finish pending writes and close the store threads' connections (app shutdown)."""
        self.db.close()
