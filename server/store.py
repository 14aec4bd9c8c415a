"""Runs, their step metrics and events, and revoked write tokens, in SQLite (WAL, a file in the
data dir: the embedded default) or PostgreSQL (ANDREA_DATABASE_URL: several server processes
share it). One code path through SQLAlchemy Core: the tables are defined once below, the SQL is
what both understand; only the locking (BEGIN IMMEDIATE / SELECT ... FOR UPDATE) and the row
source of add_metrics' INSERT differ. An older database gains the columns it lacks when it
opens. All I/O runs on the store's threads (one writer for SQLite, a small pool for
PostgreSQL), never on the event loop; the PRIMARY KEY (run_id, step) makes a resent record a
no-op (add_metrics returns the rows it really inserted: what viewers are sent). Readers of a
whole run page through it (metrics_page, records_page_json, events_page): nothing holds a big
run in memory at once. A full disk, a read-only data dir, a database that cannot be opened or
a PostgreSQL server out of reach raise StoreUnavailable with the reason and the path or URL
(API: 503; trainer: close 1013)."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Double,
    ForeignKey,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    bindparam,
    create_engine,
    inspect,
    text,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.pool import StaticPool

from andrea.auth import token_hash, token_matches
from andrea.metrics import COLUMNS, REQUIRED
from andrea.model import model_name, with_shape


class StoreUnavailable(RuntimeError):
    """The database cannot be written (full disk, read-only data dir), opened or reached: the
    reason, with the file's path or the server's URL."""


# SQLite's primary result codes that mean "the disk or the file system refused", not a bug.
_DISK_CODES = {"SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN",
               "SQLITE_PERM", "SQLITE_NOTADB", "SQLITE_CORRUPT"}


def unavailable(e: BaseException, where: Path | str) -> StoreUnavailable | None:
    """The StoreUnavailable that a disk-side sqlite3 or OS error, or a PostgreSQL server out of
    reach (connection refused or lost, shut down, out of disk), means; None for other errors.
    `where`: the file's path or the URL (password hidden)."""
    if isinstance(e, DBAPIError):
        if isinstance(e.orig, sqlite3.Error):
            e = e.orig
        elif isinstance(e, (OperationalError, InterfaceError)):
            reason = " ".join(str(e.orig).split())
            return StoreUnavailable(f"the server cannot use its database {where}: {reason}")
        else:
            return None
    if isinstance(e, sqlite3.Error):
        name = getattr(e, "sqlite_errorname", "") or ""
        if "_".join(name.split("_")[:2]) not in _DISK_CODES:
            return None
        return StoreUnavailable(f"the server cannot write its database {where}: {e} ({name})")
    if isinstance(e, OSError):
        return StoreUnavailable(f"the server cannot use its database {where}: "
                                f"{e.strerror or e}")
    return None


# The tables, for both databases. A column missing from an older database is added when it
# opens (Store._open): each numeric field of metrics.Record has a column of its own (NULL: the
# field was not sent, or for a required field, not finite); the rest is JSON text.
_TYPES = {"INTEGER": BigInteger, "REAL": Double}
META = MetaData()
RUNS = Table(
    "runs", META,
    Column("id", Text, primary_key=True),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("config", Text, nullable=False),             # JSON: the validated run config
    Column("token_sha256", Text, nullable=False),       # the trainer's write token, hashed
    Column("status", Text, nullable=False),             # run_info.RunStatus
    Column("message", Text),                            # why it failed or stopped
    Column("adapter", Text),                            # JSON: the trainer's GPU adapter
    Column("checkpoint_step", BigInteger),              # the newest committed checkpoint
    Column("name", Text),               # what people call it ("tiny adamw #12"); renamable
    Column("tags", Text),                               # JSON list of strings
    Column("notes", Text),
    # The "#12" of a default name: MAX + 1 when created (an older SQLite file: its rowid).
    # Two processes creating runs at the same instant on PostgreSQL may share one: cosmetic.
    Column("number", BigInteger),
)
METRICS = Table(
    "metrics", META,
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    *(Column(name, _TYPES[t], nullable=name != "step") for name, t in COLUMNS.items()),
    Column("extra", Text),          # JSON of the record's non-numeric fields (source_losses)
    PrimaryKeyConstraint("run_id", "step"),
    sqlite_with_rowid=False,
)
EVENTS = Table(
    "events", META,
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),               # sample | phase | resumed
    Column("data", Text, nullable=False),               # JSON
    PrimaryKeyConstraint("run_id", "step", "kind"),
    sqlite_with_rowid=False,
)
REVOKED = Table(                                        # a resume revokes the token it replaces
    "revoked_tokens", META,
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    Column("token_sha256", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "token_sha256"),
    sqlite_with_rowid=False,
)

# PostgreSQL handles concurrency itself: this many store threads and pooled connections (and
# as many again for callers off those threads: the run registry, the CLI).
PG_WORKERS = 4
# Rows per INSERT in add_metrics on SQLite: a whole batch (telemetry.MAX_RECORDS) in one.
_INSERT_PAGE = 2500
# Taken while a PostgreSQL database gets its tables: two processes starting at once.
_SCHEMA_LOCK = 0x616E64726561       # "andrea"

# What a run's row carries besides its own columns: its last step and loss, when its first and
# last records were committed (elapsed time), and its eval losses.
_RUN_SELECT = (
    "SELECT r.*, (SELECT MAX(step) FROM metrics m WHERE m.run_id = r.id) AS last_step,"
    " (SELECT loss FROM metrics m WHERE m.run_id = r.id ORDER BY step DESC LIMIT 1)"
    " AS last_loss,"
    " (SELECT time FROM metrics m WHERE m.run_id = r.id ORDER BY step LIMIT 1) AS first_time,"
    " (SELECT time FROM metrics m WHERE m.run_id = r.id ORDER BY step DESC LIMIT 1)"
    " AS last_time,"
    " (SELECT eval_loss FROM metrics m WHERE m.run_id = r.id AND eval_loss IS NOT NULL"
    " ORDER BY step DESC LIMIT 1) AS last_eval_loss,"
    " (SELECT MIN(eval_loss) FROM metrics m WHERE m.run_id = r.id) AS best_eval_loss"
    " FROM runs r")
# CAST: PostgreSQL cannot type a bare parameter in a SELECT list.
_COPY_METRICS = text(f"INSERT INTO metrics (run_id, {', '.join(COLUMNS)}, extra)"
                     f" SELECT CAST(:run_id AS TEXT), {', '.join(COLUMNS)}, extra FROM metrics"
                     " WHERE run_id = :parent AND step <= :step")
_COPY_EVENTS = text("INSERT INTO events (run_id, step, kind, data)"
                    " SELECT CAST(:run_id AS TEXT), step, kind, data FROM events"
                    " WHERE run_id = :parent AND step <= :step AND kind != 'resumed'")
_PUT_EVENT = text("INSERT INTO events (run_id, step, kind, data) VALUES"
                  " (:run_id, :step, :kind, :data)"
                  " ON CONFLICT (run_id, step, kind) DO UPDATE SET data = excluded.data")
# The run's updated_at and its highest step, in one statement after a batch's insert.
_TOUCH_RUN = text("UPDATE runs SET updated_at = :now WHERE id = :run_id"
                  " RETURNING (SELECT MAX(step) FROM metrics WHERE run_id = :run_id)")
_ABANDON = text(
    "UPDATE runs SET status = 'abandoned', message = :message WHERE status = 'created'"
    " AND updated_at < :before AND checkpoint_step IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = runs.id)"
    " AND id NOT IN :connected RETURNING id"
).bindparams(bindparam("connected", expanding=True, type_=Text))


def engine_url(url: str) -> URL:
    """The SQLAlchemy URL of ANDREA_DATABASE_URL: postgresql:// (or postgres://) goes through
    psycopg 3."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return u.set(drivername="postgresql+psycopg")
    raise ValueError(f"ANDREA_DATABASE_URL must be postgresql://user@host:port/database, "
                     f"not {u.render_as_string(hide_password=True)}")


# Batches of records committed in one transaction at most (add_metrics_grouped).
GROUP_COMMIT_MAX = 64


class Store:
    def __init__(self, path: Path | None = None, *, url: str | None = None):
        """The SQLite file at `path`, or (`url`) a PostgreSQL database; Store.open picks from
        the settings."""
        self.path = path
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._waiting: list[tuple[str, list[dict], asyncio.Future]] = []   # group commit
        self._committing = False
        if url is None:
            assert path is not None, "a SQLite path or a PostgreSQL URL"
            self.where: Path | str = path
            self._engine = None
            self._threads, self._row_lock = 1, ""
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._open()
            except (sqlite3.Error, OSError, DBAPIError) as e:
                self._close_conn()
                raise unavailable(e, path) or e from e
            return
        u = engine_url(url)
        self.where = u.render_as_string(hide_password=True)
        self._threads, self._row_lock = PG_WORKERS, " FOR UPDATE"
        self._engine = create_engine(
            u, pool_size=PG_WORKERS, max_overflow=PG_WORKERS, pool_pre_ping=True,
            connect_args={"connect_timeout": 10})
        # add_metrics' INSERT takes the batch as one JSON parameter, typed here: psycopg would
        # parse a placeholder per value on the client (6x slower for 500 rows).
        values = [c for c in METRICS.columns if c.name != "run_id"]
        names = ", ".join(c.name for c in values)
        self._pg_insert_metrics = text(
            f"INSERT INTO metrics (run_id, {names}) SELECT CAST(:run_id AS TEXT), {names}"
            " FROM json_to_recordset(CAST(:rows AS json)) AS x("
            + ", ".join(f"{c.name} {c.type.compile(self._engine.dialect)}" for c in values)
            + ") ON CONFLICT DO NOTHING RETURNING step")
        try:
            self._open()
        except DBAPIError as e:
            self._engine.dispose()
            raise unavailable(e, self.where) or e from e

    @classmethod
    def open(cls, database_url: str | None, sqlite_path: Path) -> Store:
        """PostgreSQL at `database_url` (settings.database_url) when set, else the SQLite file
        at `sqlite_path`."""
        return cls(url=database_url) if database_url else cls(sqlite_path)

    @property
    def postgres(self) -> bool:
        return self._engine is not None

    def _open(self) -> None:
        """Creates the tables that are missing and adds the columns an older database lacks
        (ALTER TABLE ADD COLUMN, typed for its dialect). Nothing is written when none is."""
        with self._tx() as db:
            missing = _missing(db)
        if not missing:
            return
        with self._tx(write=True) as db:
            if self.postgres:
                db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            missing = _missing(db)      # again, under the lock
            have_tables = set(inspect(db).get_table_names())
            META.create_all(db)
            for column in missing:
                if column.table.name in have_tables:
                    db.execute(text(f"ALTER TABLE {column.table.name} ADD COLUMN {column.name}"
                                    f" {column.type.compile(db.dialect)}"))
            if RUNS.c.number in missing and "runs" in have_tables:
                db.execute(text(
                    "UPDATE runs SET number = rowid" if not self.postgres else
                    "UPDATE runs SET number = s.n FROM (SELECT id, ROW_NUMBER() OVER"
                    " (ORDER BY created_at) AS n FROM runs) s WHERE runs.id = s.id"))

    def _conn(self) -> sqlite3.Connection:
        """This thread's sqlite3 connection (autocommit: transactions are begun explicitly)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def _sqlite(self) -> Connection:
        """This thread's SQLAlchemy connection over its sqlite3 connection (made again when
        _conn hands out another one)."""
        raw = self._conn()
        held = getattr(self._local, "db", None)
        if held is None or held[0] is not raw:
            engine = create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool,
                                   insertmanyvalues_page_size=_INSERT_PAGE)
            held = self._local.db = (raw, engine.connect())
        return held[1]

    @contextmanager
    def _tx(self, write: bool = False) -> Iterator[Connection]:
        """One transaction. SQLite: a single statement commits on its own; `write` takes the
        write lock first (BEGIN IMMEDIATE), so writers serialize. PostgreSQL: the pool's
        connection; a writer that must serialize locks its run's row (self._row_lock)."""
        if self._engine is None:
            db = self._sqlite()
            with db.begin():        # commits (or rolls back) the sqlite3 connection
                if write:
                    db.exec_driver_sql("BEGIN IMMEDIATE")
                yield db
        else:
            with self._engine.begin() as db:
                yield db

    async def run(self, fn, *args):
        """Run a store method on the store's threads, off the event loop. StoreUnavailable
        when the disk refuses (full, read-only) or the database server is out of reach."""
        if self._pool is None:      # opened on first use, again after close()
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix=(
                "postgres" if self.postgres else "sqlite"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except (sqlite3.Error, OSError, DBAPIError) as e:
            refused = unavailable(e, self.where)
            if refused is None:
                raise
            raise refused from e

    def close(self) -> None:
        """Finish pending writes and close the store threads' connections (app shutdown)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            if self._engine is None:
                pool.submit(self._close_conn).result()
            pool.shutdown(wait=True)
        if self._engine is not None:
            self._engine.dispose()

    def _close_conn(self) -> None:
        held = getattr(self._local, "db", None)
        self._local.db = None
        if held is not None:
            held[1].close()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _lock_run(self, db: Connection, run_id: str, columns: str = "1"):
        """The run's row (None: unknown), locked FOR UPDATE on PostgreSQL: transactions that
        change a run serialize on it across processes (SQLite: BEGIN IMMEDIATE already did)."""
        return db.execute(text(f"SELECT {columns} FROM runs WHERE id = :id{self._row_lock}"),
                          {"id": run_id}).mappings().first()

    # ---- runs ---------------------------------------------------------------------------
    def create_run(self, run_id: str, config: dict, token_sha256: str,
                   name: str | None = None) -> None:
        with self._tx(write=True) as db:
            self._insert_run(db, run_id, config, token_sha256, name)

    def _insert_run(self, db: Connection, run_id: str, config: dict, token_sha256: str,
                    name: str | None, checkpoint_step: int | None = None) -> None:
        """A new `created` row (inside the caller's transaction), named "tiny adamw #12" by
        default: the preset, the optimizer and the run's number on this server."""
        number = db.execute(text("SELECT COALESCE(MAX(number), 0) + 1 FROM runs")).scalar()
        now = time.time()
        db.execute(text(
            "INSERT INTO runs (id, created_at, updated_at, config, token_sha256, status,"
            " checkpoint_step, name, tags, number) VALUES (:id, :now, :now, :config, :token,"
            " 'created', :checkpoint_step, :name, '[]', :number)"),
            {"id": run_id, "now": now, "config": json.dumps(config), "token": token_sha256,
             "checkpoint_step": checkpoint_step, "number": number,
             "name": name or f"{model_name(config)} {config['optimizer']} #{number}"})

    def get_run(self, run_id: str) -> dict | None:
        with self._tx() as db:
            row = db.execute(text(_RUN_SELECT + " WHERE id = :id"),
                             {"id": run_id}).mappings().first()
        return _run_dict(row) if row else None

    def update_run(self, run_id: str, fields: dict) -> bool:
        """Sets the given name, tags (a list) and notes; False for an unknown run."""
        values = {k: json.dumps(v) if k == "tags" else v for k, v in fields.items()
                  if k in ("name", "tags", "notes")}
        with self._tx() as db:
            if not values:
                return db.execute(text("SELECT 1 FROM runs WHERE id = :id"),
                                  {"id": run_id}).first() is not None
            sets = ", ".join(f"{k} = :{k}" for k in values)
            return db.execute(text(f"UPDATE runs SET {sets}, updated_at = :now WHERE id = :id"),
                              {**values, "now": time.time(), "id": run_id}).rowcount == 1

    def delete_run(self, run_id: str) -> bool:
        """The run's row, metrics, events and revoked tokens, in one transaction; False for an
        unknown run. (Its files are the caller's: checkpoints and weights.)"""
        with self._tx(write=True) as db:
            self._lock_run(db, run_id)
            for table in ("metrics", "events", "revoked_tokens"):
                db.execute(text(f"DELETE FROM {table} WHERE run_id = :id"), {"id": run_id})
            return db.execute(text("DELETE FROM runs WHERE id = :id"),
                              {"id": run_id}).rowcount == 1

    def abandon_stale(self, before: float, connected: tuple[str, ...],
                      message: str) -> list[str]:
        """Runs still `created` since before `before` that never recorded a step, have no
        checkpoint and no trainer now become `abandoned` (never started). Returns their ids
        (their viewers are told)."""
        with self._tx() as db:
            return sorted(db.execute(_ABANDON, {"message": message, "before": before,
                                                "connected": list(connected)}).scalars())

    def get_run_with_token(self, run_id: str) -> dict | None:
        with self._tx() as db:
            row = db.execute(text("SELECT id, token_sha256, status FROM runs WHERE id = :id"),
                             {"id": run_id}).mappings().first()
        return dict(row) if row else None

    def check_token(self, run_id: str, token: str) -> str | None:
        """"ok", "revoked" (a resume replaced it), "wrong", or None for an unknown run."""
        row = self.get_run_with_token(run_id)
        if row is None:
            return None
        if token_matches(row["token_sha256"], token):
            return "ok"
        with self._tx() as db:
            revoked = db.execute(text("SELECT 1 FROM revoked_tokens WHERE run_id = :id"
                                      " AND token_sha256 = :token"),
                                 {"id": run_id, "token": token_hash(token)}).first()
        return "revoked" if revoked else "wrong"

    def list_runs(self, limit: int = 200) -> list[dict]:
        with self._tx() as db:
            rows = db.execute(text(_RUN_SELECT + " ORDER BY created_at DESC LIMIT :limit"),
                              {"limit": limit}).mappings().all()
        return [_run_dict(r) for r in rows]

    def set_status(self, run_id: str, status: str, message: str | None = None,
                   adapter: dict | None = None, keep: tuple[str, ...] = ()) -> str | None:
        """Sets the status unless the run's status is in `keep` (and differs): then nothing
        changes. Returns the status the run has afterwards (None: unknown run)."""
        with self._tx(write=True) as db:
            row = self._lock_run(db, run_id, "status")
            if row is None:
                return None
            if row["status"] in keep and row["status"] != status:
                return row["status"]
            db.execute(text(
                "UPDATE runs SET status = :status, message = COALESCE(:message, message),"
                " adapter = COALESCE(:adapter, adapter), updated_at = :now WHERE id = :id"),
                {"status": status, "message": message,
                 "adapter": json.dumps(adapter) if adapter else None, "now": time.time(),
                 "id": run_id})
        return status

    def set_checkpoint_step(self, run_id: str, step: int | None) -> None:
        with self._tx() as db:
            db.execute(text("UPDATE runs SET checkpoint_step = :step WHERE id = :id"),
                       {"step": step, "id": run_id})

    def checkpoint_steps(self) -> dict[str, int]:
        with self._tx() as db:
            rows = db.execute(text("SELECT id, checkpoint_step FROM runs"
                                   " WHERE checkpoint_step IS NOT NULL")).all()
        return {run_id: step for run_id, step in rows}

    # ---- resume and branch --------------------------------------------------------------
    def resume_run(self, run_id: str, step: int, token_sha256: str,
                   resumable: tuple[str, ...]) -> str | None:
        """One transaction: the old token revoked and the new one set, metrics and events after
        `step` deleted, a `resumed` event, status `created`. Returns why not (a reason) when
        the run's status is not in `resumable` (then nothing changed), else None."""
        with self._tx(write=True) as db:    # the lock first: two resumes serialize
            row = self._lock_run(db, run_id, "status, token_sha256")
            if row is None:
                return f"unknown run {run_id!r}"
            if row["status"] not in resumable:
                return f"the run is {row['status']}"
            ids = {"run_id": run_id, "step": step}
            db.execute(text("INSERT INTO revoked_tokens (run_id, token_sha256)"
                            " VALUES (:run_id, :token) ON CONFLICT DO NOTHING"),
                       {"run_id": run_id, "token": row["token_sha256"]})
            db.execute(text("DELETE FROM metrics WHERE run_id = :run_id AND step > :step"), ids)
            db.execute(text("DELETE FROM events WHERE run_id = :run_id AND step > :step"), ids)
            db.execute(_PUT_EVENT, {**ids, "kind": "resumed", "data": "{}"})
            db.execute(text(
                "UPDATE runs SET token_sha256 = :token, status = 'created', message = NULL,"
                " checkpoint_step = :step, updated_at = :now WHERE id = :run_id"),
                {**ids, "token": token_sha256, "now": time.time()})
        return None

    def create_branch(self, run_id: str, config: dict, token_sha256: str, parent_id: str,
                      step: int, name: str | None = None) -> None:
        """A new run that starts after the parent's step `step`: the parent's metrics and
        events up to it copied (charts and the bandit's replay go on from there), a
        `resumed` event naming the parent, its checkpoint step set. One transaction."""
        with self._tx(write=True) as db:
            self._lock_run(db, parent_id)   # a resume of the parent waits for the copy
            self._insert_run(db, run_id, config, token_sha256, name, checkpoint_step=step)
            copy = {"run_id": run_id, "parent": parent_id, "step": step}
            db.execute(_COPY_METRICS, copy)
            db.execute(_COPY_EVENTS, copy)
            db.execute(_PUT_EVENT, {"run_id": run_id, "step": step, "kind": "resumed",
                                    "data": json.dumps({"parent": parent_id})})

    # ---- metrics ------------------------------------------------------------------------
    def add_metrics(self, run_id: str, records: list[dict]) -> tuple[list[dict], int | None]:
        """Insert records (metrics.Record.row(); existing steps are kept as they are, first
        write wins), each stamped with the commit's wall-clock `time`. Returns (the records
        really inserted, as stored and in step order; the highest committed step): viewers
        are sent exactly those. Two statements (the hot path): the batch's one INSERT ... ON
        CONFLICT DO NOTHING RETURNING step, and the run's UPDATE that returns its last step."""
        return self.add_metrics_many([(run_id, records)])[0]

    def add_metrics_many(self, batches: list[tuple[str, list[dict]]]
                         ) -> list[tuple[list[dict], int | None]]:
        """add_metrics for several batches (of any runs) in ONE transaction: one commit (one
        WAL sync) for what many trainers sent meanwhile (see add_metrics_grouped)."""
        now = round(time.time(), 3)
        with self._tx(write=True) as db:  # one transaction: the batches commit whole or not at all
            return [self._insert_metrics(db, run_id, records, now) for run_id, records in batches]

    def _insert_metrics(self, db, run_id: str, records: list[dict],
                        now: float) -> tuple[list[dict], int | None]:
        batch: dict[int, dict] = {}
        for r in records:           # a step twice in one batch: the first one, as ever
            batch.setdefault(r["step"], {**r, "time": now})
        batch = dict(sorted(batch.items()))
        rows = []
        for r in batch.values():
            extra = {k: v for k, v in r.items() if k not in COLUMNS}
            rows.append({"run_id": run_id, **{c: _finite(r.get(c)) for c in COLUMNS},
                         "extra": json.dumps(extra) if extra else None})
        if not rows:
            kept = set()
        elif self.postgres:     # the batch as one JSON parameter (see _pg_insert_metrics)
            kept = set(db.execute(self._pg_insert_metrics, {
                "run_id": run_id, "rows": json.dumps(rows, allow_nan=False)}).scalars())
        else:
            kept = set(db.execute(sqlite_insert(METRICS).on_conflict_do_nothing()
                                  .returning(METRICS.c.step), rows).scalars())
        touched = db.execute(_TOUCH_RUN, {"now": time.time(), "run_id": run_id}).first()
        last = touched[0] if touched else db.execute(
            text("SELECT MAX(step) FROM metrics WHERE run_id = :id"), {"id": run_id}).scalar()
        return [r for step, r in batch.items() if step in kept], last

    async def add_metrics_grouped(self, run_id: str,
                                  records: list[dict]) -> tuple[list[dict], int | None]:
        """add_metrics from the event loop, sharing a transaction with the batches other
        trainers sent while the previous one committed (group commit): under load one commit
        serves many batches instead of each waiting for its own, so the writer keeps up."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting.append((run_id, records, done))
        if not self._committing:
            self._committing = True
            loop.create_task(self._commit_waiting())
        return await done

    async def _commit_waiting(self) -> None:
        try:
            while self._waiting:
                group = self._waiting[:GROUP_COMMIT_MAX]
                del self._waiting[:GROUP_COMMIT_MAX]
                try:
                    results = await self.run(self.add_metrics_many,
                                             [(run_id, records) for run_id, records, _ in group])
                except StoreUnavailable as e:      # every trainer keeps its records
                    results = [e] * len(group)
                except Exception:
                    # One bad batch must not fail the others: each on its own.
                    results = []
                    for run_id, records, _ in group:
                        try:
                            results.append(await self.run(self.add_metrics, run_id, records))
                        except Exception as e:
                            results.append(e)
                for (_, _, done), result in zip(group, results):
                    if done.done():
                        continue            # its trainer went away meanwhile
                    if isinstance(result, Exception):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            self._committing = False

    def last_step(self, run_id: str) -> int | None:
        with self._tx() as db:
            return db.execute(text("SELECT MAX(step) FROM metrics WHERE run_id = :id"),
                              {"id": run_id}).scalar()

    def metrics(self, run_id: str, after: int | None = None) -> list[dict]:
        """Every record after `after`: only for what needs them all at once (the export);
        anything serving requests pages with metrics_page."""
        return self.metrics_page(run_id, after, None)

    def metrics_page(self, run_id: str, after: int | None, limit: int | None) -> list[dict]:
        """Up to `limit` records with step > after, in step order."""
        sql = "SELECT * FROM metrics WHERE run_id = :id AND step > :after ORDER BY step"
        with self._tx() as db:
            rows = db.execute(text(sql if limit is None else sql + " LIMIT :limit"),
                              {"id": run_id, "after": -1 if after is None else after,
                               "limit": limit}).mappings().all()
        out = []
        for row in rows:
            d = {c: row[c] for c in COLUMNS if row[c] is not None or c in REQUIRED}
            if row["extra"]:
                d.update(json.loads(row["extra"]))
            out.append(d)
        return out

    def records_page_json(self, run_id: str, after: int | None,
                          limit: int) -> tuple[str | None, int | None, int]:
        """A viewer's backlog page, encoded here on the store thread: (the message
        {"type": "records", "records": [...]} as JSON text or None, its last step, count)."""
        page = self.metrics_page(run_id, after, limit)
        if not page:
            return None, after, 0
        return (json.dumps({"type": "records", "records": page}, allow_nan=False),
                page[-1]["step"], len(page))

    def first_resume_after(self, run_id: str, step: int) -> int | None:
        """The lowest step < `step` that the run was resumed from (None: none): a viewer
        that had records up to `step` may hold stale ones after it."""
        with self._tx() as db:
            return db.execute(text("SELECT MIN(step) FROM events WHERE run_id = :id"
                                   " AND kind = 'resumed' AND step < :step"),
                              {"id": run_id, "step": step}).scalar()

    # ---- events (text samples, bandit phases) -------------------------------------------
    def add_event(self, run_id: str, step: int, kind: str, data: dict) -> None:
        with self._tx() as db:
            db.execute(_PUT_EVENT, {"run_id": run_id, "step": step, "kind": kind,
                                    "data": json.dumps(data)})

    def events(self, run_id: str, kind: str | None = None, last: int | None = None
               ) -> list[dict]:
        """The run's events in step order; `last`: only the newest `last` of them."""
        sql = ("SELECT step, kind, data FROM events WHERE run_id = :id"
               + (" AND kind = :kind" if kind is not None else "")
               + " ORDER BY step DESC, kind DESC" + (" LIMIT :last" if last is not None else ""))
        with self._tx() as db:
            rows = db.execute(text(f"SELECT * FROM ({sql}) e ORDER BY step, kind"),
                              {"id": run_id, "kind": kind, "last": last}).mappings().all()
        return [{"step": r["step"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    def events_page(self, run_id: str, after: tuple[int, str], limit: int) -> list[dict]:
        """Up to `limit` events after (step, kind), in (step, kind) order."""
        with self._tx() as db:
            rows = db.execute(text(
                "SELECT step, kind, data FROM events WHERE run_id = :id"
                " AND (step, kind) > (:step, :kind) ORDER BY step, kind LIMIT :limit"),
                {"id": run_id, "step": after[0], "kind": after[1], "limit": limit}
            ).mappings().all()
        return [{"step": r["step"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]


def _missing(db: Connection) -> list[Column]:
    """The columns of META (all of a missing table's) that the database lacks."""
    have = inspect(db)
    tables = set(have.get_table_names())
    missing = []
    for table in META.sorted_tables:
        present = ({c["name"] for c in have.get_columns(table.name)}
                   if table.name in tables else set())
        missing += [c for c in table.columns if c.name not in present]
    return missing


def _finite(v):
    """NULL for a number that is not finite (what SQLite makes of NaN), on both databases."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _run_dict(row) -> dict:
    d = dict(row)
    d.pop("token_sha256", None)
    d.pop("number", None)
    d["config"] = with_shape(json.loads(d["config"]))
    d["adapter"] = json.loads(d["adapter"]) if d["adapter"] else None
    d["tags"] = json.loads(d["tags"]) if d.get("tags") else []
    d["name"] = d.get("name") or f"{model_name(d['config'])} {d['config']['optimizer']}"
    return d
