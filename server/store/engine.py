"""Where the store's SQL runs (Database): SQLite (one connection per store thread, WAL) or
PostgreSQL (a pool), one transaction at a time (Database.tx), on the store's threads
(Database.run: one writer for SQLite, a small pool for PostgreSQL; the methods marked @reads go
to their own reader threads and connections, so a long read never queues a trainer's commit),
never on the event loop; and what a database that refuses means (StoreUnavailable: full disk,
read-only data dir, a file that cannot be opened, a server out of reach)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.pool import StaticPool

from andrea.errors import UNAVAILABLE, UNAVAILABLE_RETRY_S, Refused


class StoreUnavailable(Refused):
    """The database cannot be written (full disk, read-only data dir), opened or reached: the
    reason, with the file's path or the server's URL (UNAVAILABLE: API 503, trainer 1013)."""

    def __init__(self, message: str):
        super().__init__(UNAVAILABLE, message, UNAVAILABLE_RETRY_S)


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


# PostgreSQL handles concurrency itself: this many store threads and pooled connections (and
# as many again for the reader threads, and for callers off those threads: the run registry,
# the CLI).
PG_WORKERS = 4
# Reader threads (each with its own connection; WAL lets SQLite readers run beside the writer):
# reads of whole runs (exports, CSV pages, viewers' backlogs) never wait for the writer, nor it
# for them.
READ_WORKERS = 4
# Rows per INSERT in Metrics.add on SQLite: a whole batch (telemetry.MAX_RECORDS) in one.
_INSERT_PAGE = 2500


# The attribute @reads sets on a method that only reads (Database.run).
READS = "store_reads"


def reads(method):
    """Marks a store method that only reads: Database.run sends it to the reader threads,
    whoever calls it, so no caller gets it onto the writer. A token check or a run's last step
    is no such read: it must see the writes queued before it."""
    setattr(method, READS, True)
    return method


def engine_url(url: str) -> URL:
    """The SQLAlchemy URL of ANDREA_DATABASE_URL: postgresql:// (or postgres://) goes through
    psycopg 3."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return u.set(drivername="postgresql+psycopg")
    raise ValueError(f"ANDREA_DATABASE_URL must be postgresql://user@host:port/database, "
                     f"not {u.render_as_string(hide_password=True)}")


class Database:
    """The store's database: its connections (SQLite: one per store thread; PostgreSQL: a
    pool), one transaction at a time (tx), and the store's threads that run its methods
    (run). Made current by the schema when it starts (start)."""

    def __init__(self, path: Path | None = None, *, url: str | None = None):
        """The SQLite file at `path`, or (`url`) a PostgreSQL database; nothing is opened
        until start()."""
        self.path = path
        self._pool: ThreadPoolExecutor | None = None
        self._read_pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._readers: list[tuple] = []     # the reader threads' (sqlite3, SQLAlchemy) pairs
        self._readers_lock = threading.Lock()
        if url is None:
            assert path is not None, "a SQLite path or a PostgreSQL URL"
            self.where: Path | str = path
            self._engine = None
            self._threads, self._row_lock = 1, ""
            return
        u = engine_url(url)
        self.where = u.render_as_string(hide_password=True)
        self._threads, self._row_lock = PG_WORKERS, " FOR UPDATE"
        self._engine = create_engine(
            u, pool_size=PG_WORKERS + READ_WORKERS, max_overflow=PG_WORKERS, pool_pre_ping=True,
            connect_args={"connect_timeout": 10})

    def start(self, prepare: Callable[[], None]) -> None:
        """Opens the database and runs `prepare` (the schema's migrate: makes it current) on
        this thread; SQLite: then the reader threads. StoreUnavailable when it cannot be opened,
        written or reached."""
        if self._engine is None:
            assert self.path is not None
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                prepare()
                self._start_readers()
            except (sqlite3.Error, OSError, DBAPIError) as e:
                self._close_conn()
                raise unavailable(e, self.path) or e from e
            return
        try:
            prepare()
        except DBAPIError as e:
            self._engine.dispose()
            raise unavailable(e, self.where) or e from e

    @property
    def postgres(self) -> bool:
        return self._engine is not None

    @property
    def dialect(self) -> Dialect:
        """The PostgreSQL engine's SQL dialect (what metrics' INSERT types its columns in)."""
        assert self._engine is not None, "PostgreSQL only"
        return self._engine.dialect

    def sqlite_connection(self) -> sqlite3.Connection:
        """This thread's sqlite3 connection (autocommit: transactions are begun explicitly)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # (Not tied to its thread: close() closes the reader threads' connections.)
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # Freed pages go onto the free list unwritten (Debian's SQLite zeroes each one by
            # default: deleting a run of 24 MiB wrote 25 MB of WAL, 631 KB like this), so an
            # operator's delete at the storage floor needs next to no free space (storage.py).
            conn.execute("PRAGMA secure_delete=FAST")
            self._local.conn = conn
        return conn

    def _sqlite(self) -> Connection:
        """This thread's SQLAlchemy connection over its sqlite3 connection (made again when
        sqlite_connection hands out another one)."""
        raw = self.sqlite_connection()
        held = getattr(self._local, "db", None)
        if held is None or held[0] is not raw:
            engine = create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool,
                                   insertmanyvalues_page_size=_INSERT_PAGE)
            held = self._local.db = (raw, engine.connect())
            if threading.current_thread().name.startswith("store-read"):
                with self._readers_lock:
                    self._readers.append(held)
        return held[1]

    @contextmanager
    def tx(self, write: bool = False) -> Iterator[Connection]:
        """One transaction. SQLite: a single statement commits on its own; `write` takes the
        write lock first (BEGIN IMMEDIATE), so writers serialize. PostgreSQL: the pool's
        connection; a writer that must serialize locks its run's row (lock_run)."""
        if self._engine is None:
            conn = self._sqlite()
            with conn.begin():      # commits (or rolls back) the sqlite3 connection
                if write:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
        else:
            with self._engine.begin() as conn:
                yield conn

    def lock_run(self, conn: Connection, run_id: str, columns: str = "1"):
        """The run's row (None: unknown), locked FOR UPDATE on PostgreSQL: transactions that
        change a run serialize on it across processes (SQLite: BEGIN IMMEDIATE already did)."""
        return conn.execute(text(f"SELECT {columns} FROM runs WHERE id = :id{self._row_lock}"),
                            {"id": run_id}).mappings().first()

    async def run(self, fn, *args):
        """Run a store method on the store's threads, off the event loop: one marked @reads on
        the reader threads, any other on the writer's (see read). StoreUnavailable when the
        disk refuses (full, read-only) or the database server is out of reach."""
        if getattr(fn, READS, False):
            return await self.read(fn, *args)
        if self._pool is None:      # opened on first use, again after close()
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix=(
                "postgres" if self.postgres else "sqlite"))
        return await self._on(self._pool, fn, *args)

    async def read(self, fn, *args):
        """Run a function that only reads on the reader threads, each with its own connection:
        it never queues behind the writer (a trainer's commit), nor the writer behind it."""
        if self._read_pool is None:
            self._start_readers()
        return await self._on(self._read_pool, fn, *args)

    def _start_readers(self) -> None:
        """Every reader thread and its connection at once (SQLite), not one by one as reads
        come: the server's threads and open files are what they will stay from the start."""
        self._read_pool = pool = ThreadPoolExecutor(max_workers=READ_WORKERS,
                                                    thread_name_prefix="store-read")
        if self._engine is None:
            barrier = threading.Barrier(READ_WORKERS)   # holds each thread until all exist

            def open_reader() -> None:
                self._sqlite()
                barrier.wait(timeout=30)

            for f in [pool.submit(open_reader) for _ in range(READ_WORKERS)]:
                f.result()

    async def _on(self, pool: ThreadPoolExecutor, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
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
        readers, self._read_pool = self._read_pool, None
        if readers is not None:
            readers.shutdown(wait=True)
        with self._readers_lock:
            held, self._readers = self._readers, []
        for raw, conn in held:      # (their threads are gone: closed from here)
            conn.close()
            raw.close()
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

    @reads
    def free_page_bytes(self) -> int:
        """The bytes of the SQLite file's free pages (what deleted rows left: reused before
        the file grows, so the storage budget counts them as free for rows); 0 on PostgreSQL."""
        if self.postgres:
            return 0
        with self.tx() as conn:
            pages = conn.execute(text("PRAGMA freelist_count")).scalar()
            size = conn.execute(text("PRAGMA page_size")).scalar()
        return int(pages or 0) * int(size or 0)
