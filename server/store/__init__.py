"""Runs, their step metrics and events, and revoked write tokens, in SQLite (WAL, a file in the
data dir: the embedded default) or PostgreSQL (ANDREA_DATABASE_URL: several server processes
share it). One code path through SQLAlchemy Core: the tables are defined once (schema.py), the
SQL is what both understand; only the locking (BEGIN IMMEDIATE / SELECT ... FOR UPDATE) and the
row source of add_metrics' INSERT differ. An older database gains the columns it lacks when it
opens. All I/O runs on the store's threads (one writer for SQLite, a small pool for
PostgreSQL), never on the event loop; the PRIMARY KEY (run_id, step) makes a resent record a
no-op (add_metrics returns the rows it really inserted: what viewers are sent). Each run's row
carries its summary (last step and loss, times, eval losses), kept in step with its records,
so listing runs never reads records. Readers of a whole run page through it (metrics_page,
records_page_json, events_page): nothing holds a big run in memory at once. A full disk, a
read-only data dir, a database that cannot be opened or a PostgreSQL server out of reach raise
StoreUnavailable with the reason and the path or URL (API: 503; trainer: close 1013).

  engine.py   connections, transactions, the store's threads, StoreUnavailable
  schema.py   the tables; creating them, and migrating an older database
  run_rows.py run rows: create, read, list, rename, delete, status, tokens, resume, branch
  summary.py  the run summary on the run's row: updated with each batch, recomputed
  metrics.py  step records: batches, the group commit, pages
  events.py   samples, phases, resumes
"""

from __future__ import annotations

from andrea.store.engine import (
    PG_WORKERS,
    Connections,
    StoreUnavailable,
    engine_url,
    unavailable,
)
from andrea.store.events import Events
from andrea.store.metrics import GROUP_COMMIT_MAX, Metrics
from andrea.store.run_rows import Runs
from andrea.store.schema import COUNTERS, EVENTS, META, METRICS, REVOKED, RUNS, Schema

__all__ = ["COUNTERS", "EVENTS", "GROUP_COMMIT_MAX", "META", "METRICS", "PG_WORKERS", "REVOKED",
           "RUNS", "Store", "StoreUnavailable", "engine_url", "unavailable"]


class Store(Connections, Schema, Runs, Metrics, Events):
    """The store: Store(path) for SQLite, Store(url=...) for PostgreSQL, Store.open(settings'
    database URL or None, the SQLite path) to pick. Its methods do blocking I/O: call them
    through `await store.run(store.method, ...)` on the event loop."""

    # The methods that only read: run() sends them to the reader threads (engine.py), chosen
    # here by name so that every caller, whoever wrote it, gets them off the writer. Token
    # checks and last_step are left on the writer: they must see the writes queued before them.
    READS = frozenset({"get_run", "list_runs", "checkpoint_steps", "metrics", "metrics_page",
                       "records_page_json", "card_summary", "events", "events_page",
                       "first_resume_after", "resume_count", "record_usage", "free_page_bytes"})
