"""SQLite store (WAL): runs, their step metrics and events, and revoked write tokens. All I/O
runs on one writer thread, never on the event loop; the PRIMARY KEY (run_id, step) makes a
resent record a no-op (add_metrics returns the rows it really inserted: what viewers are sent).
Readers of a whole run page through it (metrics_page, records_page_json, events_page): nothing
holds a big run in memory at once. A full disk, a read-only data dir or a database that cannot
be opened raise StoreUnavailable with the reason and the path (API: 503; trainer: close 1013)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from andrea.auth import token_hash, token_matches
from andrea.metrics import COLUMNS, REQUIRED


class StoreUnavailable(RuntimeError):
    """The database cannot be written (full disk, read-only data dir) or opened: the reason,
    with the file's path."""


# SQLite's primary result codes that mean "the disk or the file system refused", not a bug.
_DISK_CODES = {"SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN",
               "SQLITE_PERM", "SQLITE_NOTADB", "SQLITE_CORRUPT"}


def unavailable(e: BaseException, path: Path) -> StoreUnavailable | None:
    """The StoreUnavailable that a disk-side sqlite3 or OS error means; None for other errors."""
    if isinstance(e, sqlite3.Error):
        name = getattr(e, "sqlite_errorname", "") or ""
        if "_".join(name.split("_")[:2]) not in _DISK_CODES:
            return None
        return StoreUnavailable(f"the server cannot write its database {path}: {e} ({name})")
    if isinstance(e, OSError):
        return StoreUnavailable(f"the server cannot use its database {path}: "
                                f"{e.strerror or e}")
    return None


SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL,
  config TEXT NOT NULL,            -- JSON: the validated run config
  token_sha256 TEXT NOT NULL,      -- the trainer's write token, hashed
  status TEXT NOT NULL,            -- run_info.RunStatus
  message TEXT,                    -- why it failed or stopped
  adapter TEXT,                    -- JSON: the GPU adapter the trainer reported
  checkpoint_step INTEGER,         -- the newest committed checkpoint (checkpoints.py)
  name TEXT,                       -- what people call it ("tiny adamw #12"); renamable
  tags TEXT,                       -- JSON list of strings
  notes TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
  run_id TEXT NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  extra TEXT,                      -- JSON of the record's non-numeric fields (source_losses)
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  run_id TEXT NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  kind TEXT NOT NULL,              -- sample | phase | resumed
  data TEXT NOT NULL,              -- JSON
  PRIMARY KEY (run_id, step, kind)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS revoked_tokens (   -- a resume revokes the token it replaces
  run_id TEXT NOT NULL REFERENCES runs(id),
  token_sha256 TEXT NOT NULL,
  PRIMARY KEY (run_id, token_sha256)
) WITHOUT ROWID;
"""

# Each numeric field of metrics.Record has a column of its own, added to an older file when it
# opens (NULL: the field was not sent, or for a required field, not finite); the rest is JSON.
VALUE_COLUMNS = {name: t for name, t in COLUMNS.items() if name != "step"}
# Columns of `runs` added after its first version (an older file gains them when it opens).
RUN_COLUMNS = {"checkpoint_step": "INTEGER", "name": "TEXT", "tags": "TEXT", "notes": "TEXT"}
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
_COPY_METRICS = (f"INSERT INTO metrics (run_id, {', '.join(COLUMNS)}, extra)"
                 f" SELECT ?, {', '.join(COLUMNS)}, extra FROM metrics"
                 " WHERE run_id = ? AND step <= ?")
_INSERT_METRICS = (f"INSERT OR IGNORE INTO metrics (run_id, {', '.join(COLUMNS)}, extra)"
                   f" VALUES ({', '.join('?' * (len(COLUMNS) + 2))})")


class Store:
    def __init__(self, path: Path):
        self.path = path
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._open()
        except (sqlite3.Error, OSError) as e:
            self._close_conn()
            raise unavailable(e, path) or e from e

    def _open(self) -> None:
        conn = self._conn()
        conn.executescript(SCHEMA)
        have = {r["name"] for r in conn.execute("PRAGMA table_info(metrics)")}
        for name, sql_type in VALUE_COLUMNS.items():
            if name not in have:
                conn.execute(f"ALTER TABLE metrics ADD COLUMN {name} {sql_type}")
        have_runs = {r["name"] for r in conn.execute("PRAGMA table_info(runs)")}
        for name, sql_type in RUN_COLUMNS.items():
            if name not in have_runs:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {sql_type}")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    async def run(self, fn, *args):
        """Run a store method on the SQLite thread, off the event loop. StoreUnavailable when
        the disk refuses (full, read-only)."""
        if self._pool is None:      # opened on first use, again after close()
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except (sqlite3.Error, OSError) as e:
            refused = unavailable(e, self.path)
            if refused is None:
                raise
            raise refused from e

    def close(self) -> None:
        """Finish pending writes and close the writer thread's connection (app shutdown)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.submit(self._close_conn).result()
            pool.shutdown(wait=True)

    def _close_conn(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ---- runs ---------------------------------------------------------------------------
    def _default_name(self, config: dict) -> str:
        """"tiny adamw #12": the preset, the optimizer and the run's number on this server."""
        n = self._conn().execute("SELECT COALESCE(MAX(rowid), 0) + 1 FROM runs").fetchone()[0]
        return f"{config['preset']} {config['optimizer']} #{n}"

    def create_run(self, run_id: str, config: dict, token_sha256: str,
                   name: str | None = None) -> None:
        conn = self._conn()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            self._insert_run(conn, run_id, config, token_sha256, name)

    def _insert_run(self, conn: sqlite3.Connection, run_id: str, config: dict,
                    token_sha256: str, name: str | None, checkpoint_step: int | None = None):
        """A new `created` row (inside the caller's transaction)."""
        now = time.time()
        conn.execute(
            "INSERT INTO runs (id, created_at, updated_at, config, token_sha256, status,"
            " checkpoint_step, name, tags) VALUES (?, ?, ?, ?, ?, 'created', ?, ?, '[]')",
            (run_id, now, now, json.dumps(config), token_sha256, checkpoint_step,
             name or self._default_name(config)))

    def get_run(self, run_id: str) -> dict | None:
        row = self._conn().execute(_RUN_SELECT + " WHERE id = ?", (run_id,)).fetchone()
        return _run_dict(row) if row else None

    def update_run(self, run_id: str, fields: dict) -> bool:
        """Sets the given name, tags (a list) and notes; False for an unknown run."""
        values = {k: json.dumps(v) if k == "tags" else v for k, v in fields.items()
                  if k in ("name", "tags", "notes")}
        if not values:
            return self._conn().execute("SELECT 1 FROM runs WHERE id = ?",
                                        (run_id,)).fetchone() is not None
        sets = ", ".join(f"{k} = ?" for k in values)
        cur = self._conn().execute(f"UPDATE runs SET {sets}, updated_at = ? WHERE id = ?",
                                   (*values.values(), time.time(), run_id))
        return cur.rowcount == 1

    def delete_run(self, run_id: str) -> bool:
        """The run's row, metrics, events and revoked tokens, in one transaction; False for an
        unknown run. (Its files are the caller's: checkpoints and weights.)"""
        conn = self._conn()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for table in ("metrics", "events", "revoked_tokens"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            return conn.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount == 1

    def abandon_stale(self, before: float, connected: tuple[str, ...], message: str) -> int:
        """Runs still `created` since before `before` that never recorded a step, have no
        checkpoint and no trainer now become `abandoned`. Returns how many."""
        marks = ",".join("?" * len(connected))
        cur = self._conn().execute(
            "UPDATE runs SET status = 'abandoned', message = ? WHERE status = 'created'"
            " AND updated_at < ? AND checkpoint_step IS NULL"
            " AND NOT EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = runs.id)"
            f" AND id NOT IN ({marks})", (message, before, *connected))
        return cur.rowcount

    def get_run_with_token(self, run_id: str) -> dict | None:
        row = self._conn().execute("SELECT id, token_sha256, status FROM runs WHERE id = ?",
                                   (run_id,)).fetchone()
        return dict(row) if row else None

    def check_token(self, run_id: str, token: str) -> str | None:
        """"ok", "revoked" (a resume replaced it), "wrong", or None for an unknown run."""
        row = self.get_run_with_token(run_id)
        if row is None:
            return None
        if token_matches(row["token_sha256"], token):
            return "ok"
        revoked = self._conn().execute(
            "SELECT 1 FROM revoked_tokens WHERE run_id = ? AND token_sha256 = ?",
            (run_id, token_hash(token))).fetchone()
        return "revoked" if revoked else "wrong"

    def list_runs(self, limit: int = 200) -> list[dict]:
        rows = self._conn().execute(_RUN_SELECT + " ORDER BY created_at DESC LIMIT ?",
                                    (limit,)).fetchall()
        return [_run_dict(r) for r in rows]

    def set_status(self, run_id: str, status: str, message: str | None = None,
                   adapter: dict | None = None, keep: tuple[str, ...] = ()) -> str | None:
        """Sets the status unless the run's status is in `keep` (and differs): then nothing
        changes. Returns the status the run has afterwards (None: unknown run)."""
        conn = self._conn()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            if row["status"] in keep and row["status"] != status:
                return row["status"]
            conn.execute(
                "UPDATE runs SET status = ?, message = COALESCE(?, message),"
                " adapter = COALESCE(?, adapter), updated_at = ? WHERE id = ?",
                (status, message, json.dumps(adapter) if adapter else None, time.time(), run_id))
        return status

    def set_checkpoint_step(self, run_id: str, step: int | None) -> None:
        self._conn().execute("UPDATE runs SET checkpoint_step = ? WHERE id = ?", (step, run_id))

    def checkpoint_steps(self) -> dict[str, int]:
        rows = self._conn().execute(
            "SELECT id, checkpoint_step FROM runs WHERE checkpoint_step IS NOT NULL").fetchall()
        return {r["id"]: r["checkpoint_step"] for r in rows}

    # ---- resume and branch --------------------------------------------------------------
    def resume_run(self, run_id: str, step: int, token_sha256: str,
                   resumable: tuple[str, ...]) -> str | None:
        """One transaction: the old token revoked and the new one set, metrics and events after
        `step` deleted, a `resumed` event, status `created`. Returns why not (a reason) when
        the run's status is not in `resumable` (then nothing changed), else None."""
        conn = self._conn()
        with conn:
            conn.execute("BEGIN IMMEDIATE")    # the write lock first: two resumes serialize
            row = conn.execute("SELECT status, token_sha256 FROM runs WHERE id = ?",
                               (run_id,)).fetchone()
            if row is None:
                return f"unknown run {run_id!r}"
            if row["status"] not in resumable:
                return f"the run is {row['status']}"
            conn.execute("INSERT OR IGNORE INTO revoked_tokens VALUES (?, ?)",
                         (run_id, row["token_sha256"]))
            conn.execute("DELETE FROM metrics WHERE run_id = ? AND step > ?", (run_id, step))
            conn.execute("DELETE FROM events WHERE run_id = ? AND step > ?", (run_id, step))
            conn.execute("INSERT OR REPLACE INTO events VALUES (?, ?, 'resumed', '{}')",
                         (run_id, step))
            conn.execute("UPDATE runs SET token_sha256 = ?, status = 'created', message = NULL,"
                         " checkpoint_step = ?, updated_at = ? WHERE id = ?",
                         (token_sha256, step, time.time(), run_id))
        return None

    def create_branch(self, run_id: str, config: dict, token_sha256: str, parent_id: str,
                      step: int, name: str | None = None) -> None:
        """A new run that starts after the parent's step `step`: the parent's metrics and
        events up to it copied (charts and the bandit's replay go on from there), a
        `resumed` event naming the parent, its checkpoint step set. One transaction."""
        conn = self._conn()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            self._insert_run(conn, run_id, config, token_sha256, name, checkpoint_step=step)
            conn.execute(_COPY_METRICS, (run_id, parent_id, step))
            conn.execute("INSERT INTO events SELECT ?, step, kind, data FROM events"
                         " WHERE run_id = ? AND step <= ? AND kind != 'resumed'",
                         (run_id, parent_id, step))
            conn.execute("INSERT INTO events VALUES (?, ?, 'resumed', ?)",
                         (run_id, step, json.dumps({"parent": parent_id})))

    # ---- metrics ------------------------------------------------------------------------
    def add_metrics(self, run_id: str, records: list[dict]) -> tuple[list[dict], int | None]:
        """Insert records (metrics.Record.row(); existing steps are kept as they are, first
        write wins), each stamped with the commit's wall-clock `time`. Returns (the records
        really inserted, as stored and in step order; the highest committed step): viewers
        are sent exactly those."""
        conn = self._conn()
        inserted = []
        now = round(time.time(), 3)
        with conn:  # one transaction: a batch commits whole or not at all
            conn.execute("BEGIN")
            for r in sorted(records, key=lambda r: r["step"]):
                r = {**r, "time": now}
                extra = {k: v for k, v in r.items() if k not in COLUMNS}
                cur = conn.execute(_INSERT_METRICS, (run_id, *(r.get(c) for c in COLUMNS),
                                                     json.dumps(extra) if extra else None))
                if cur.rowcount == 1:
                    inserted.append(r)
            conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (time.time(), run_id))
        return inserted, self.last_step(run_id)

    def last_step(self, run_id: str) -> int | None:
        return self._conn().execute("SELECT MAX(step) FROM metrics WHERE run_id = ?",
                                    (run_id,)).fetchone()[0]

    def metrics(self, run_id: str, after: int | None = None) -> list[dict]:
        """Every record after `after`: only for what needs them all at once (the export);
        anything serving requests pages with metrics_page."""
        return self.metrics_page(run_id, after, None)

    def metrics_page(self, run_id: str, after: int | None, limit: int | None) -> list[dict]:
        """Up to `limit` records with step > after, in step order."""
        rows = self._conn().execute(
            "SELECT * FROM metrics WHERE run_id = ? AND step > ? ORDER BY step LIMIT ?",
            (run_id, -1 if after is None else after, -1 if limit is None else limit))
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
        return self._conn().execute(
            "SELECT MIN(step) FROM events WHERE run_id = ? AND kind = 'resumed' AND step < ?",
            (run_id, step)).fetchone()[0]

    # ---- events (text samples, bandit phases) -------------------------------------------
    def add_event(self, run_id: str, step: int, kind: str, data: dict) -> None:
        self._conn().execute("INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?)",
                             (run_id, step, kind, json.dumps(data)))

    def events(self, run_id: str, kind: str | None = None, last: int | None = None
               ) -> list[dict]:
        """The run's events in step order; `last`: only the newest `last` of them."""
        rows = self._conn().execute(
            "SELECT * FROM (SELECT step, kind, data FROM events WHERE run_id = ?"
            " AND (? IS NULL OR kind = ?) ORDER BY step DESC, kind DESC LIMIT ?)"
            " ORDER BY step, kind", (run_id, kind, kind, -1 if last is None else last)).fetchall()
        return [{"step": r["step"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    def events_page(self, run_id: str, after: tuple[int, str], limit: int) -> list[dict]:
        """Up to `limit` events after (step, kind), in (step, kind) order."""
        rows = self._conn().execute(
            "SELECT step, kind, data FROM events WHERE run_id = ? AND (step, kind) > (?, ?)"
            " ORDER BY step, kind LIMIT ?", (run_id, *after, limit)).fetchall()
        return [{"step": r["step"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]


def _run_dict(row: sqlite3.Row) -> dict:
    d = dict(row)
    d.pop("token_sha256", None)
    d["config"] = json.loads(d["config"])
    d["adapter"] = json.loads(d["adapter"]) if d["adapter"] else None
    d["tags"] = json.loads(d["tags"]) if d.get("tags") else []
    d["name"] = d.get("name") or f"{d['config']['preset']} {d['config']['optimizer']}"
    return d
