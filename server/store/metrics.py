"""A run's step records: committed in batches (one transaction for what many trainers sent
meanwhile: the group commit), first write wins (the PRIMARY KEY (run_id, step) makes a resent
record a no-op; Metrics.add returns the rows it really inserted: what viewers are sent), each
batch's run summary updated in its transaction (summary.py), and read back page by page."""

from __future__ import annotations

import asyncio
import json
import math
import time
from functools import cached_property

from sqlalchemy import Connection, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from andrea.metrics import COLUMNS, REQUIRED
from andrea.store.engine import Database, StoreUnavailable, reads
from andrea.store.schema import METRICS
from andrea.store.summary import Summaries

# Batches of records committed in one transaction at most (Metrics.add_grouped), and their
# bytes (about, as stored): a commit of ~330 KB of per-row losses took ~10-15 ms, and every
# other trainer's ack waited behind it. A batch bigger than GROUP_BYTES commits in pieces of
# about that size, each in its turn, with the other trainers' batches between them.
GROUP_COMMIT_MAX = 64
GROUP_BYTES = 64 << 10


def approx_bytes(record: dict) -> int:
    """About what a record takes as stored: its fields, and ~10 bytes a list entry."""
    return 200 + 10 * sum(len(v) for v in record.values() if isinstance(v, (list, dict)))


def _pieces(records: list[dict], limit: int):
    """`records` in order, in pieces of about `limit` bytes (at least one record each)."""
    piece, size = [], 0
    for r in records:
        n = approx_bytes(r)
        if piece and size + n > limit:
            yield piece, size
            piece, size = [], 0
        piece.append(r)
        size += n
    yield piece, size


class Metrics:
    """Keeps the metrics table; each batch's run summary with it (summaries)."""

    def __init__(self, db: Database, summaries: Summaries):
        self.db = db
        self.summaries = summaries
        # The group commit's queue (add_grouped): (run, records, its caller's future, bytes).
        self._waiting: list[tuple[str, list[dict], asyncio.Future, int]] = []
        self._committing = False

    @cached_property
    def _pg_insert(self):
        """add's INSERT on PostgreSQL: the batch as one JSON parameter, typed here
        (psycopg would parse a placeholder per value on the client: 6x slower for 500 rows)."""
        values = [c for c in METRICS.columns if c.name != "run_id"]
        names = ", ".join(c.name for c in values)
        return text(
            f"INSERT INTO metrics (run_id, {names}) SELECT CAST(:run_id AS TEXT), {names}"
            " FROM json_to_recordset(CAST(:rows AS json)) AS x("
            + ", ".join(f"{c.name} {c.type.compile(self.db.dialect)}" for c in values)
            + ") ON CONFLICT DO NOTHING RETURNING step")

    def add(self, run_id: str, records: list[dict]) -> tuple[list[dict], int | None]:
        """Insert records (metrics.Record.row(); existing steps are kept as they are, first
        write wins), each stamped with the commit's wall-clock `time`. Returns (the records
        really inserted, as stored and in step order; the highest committed step): viewers
        are sent exactly those. Two statements (the hot path): the batch's one INSERT ... ON
        CONFLICT DO NOTHING RETURNING step, and the run's UPDATE (its summary) that returns
        its last step."""
        return self.add_many([(run_id, records)])[0]

    def add_many(self, batches: list[tuple[str, list[dict]]]
                 ) -> list[tuple[list[dict], int | None]]:
        """add for several batches (of any runs) in ONE transaction: one commit (one WAL sync)
        for what many trainers sent meanwhile (see add_grouped)."""
        now = round(time.time(), 3)
        # One transaction: the batches commit whole or not at all.
        with self.db.tx(write=True) as conn:
            return [self.insert(conn, run_id, records, now) for run_id, records in batches]

    def insert(self, conn: Connection, run_id: str, records: list[dict],
               now: float) -> tuple[list[dict], int | None]:
        """One batch, stamped `now`, inside the caller's transaction: add's answer."""
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
        elif self.db.postgres:  # the batch as one JSON parameter (see _pg_insert)
            kept = set(conn.execute(self._pg_insert, {
                "run_id": run_id, "rows": json.dumps(rows, allow_nan=False)}).scalars())
        else:
            kept = set(conn.execute(sqlite_insert(METRICS).on_conflict_do_nothing()
                                    .returning(METRICS.c.step), rows).scalars())
        # The run's updated_at, and its summary with the rows inserted: its last step back.
        inserted = [row for row in rows if row["step"] in kept]
        touched = self.summaries.add(conn, run_id, inserted)
        last = touched[0] if touched else conn.execute(
            text("SELECT MAX(step) FROM metrics WHERE run_id = :id"), {"id": run_id}).scalar()
        return [r for step, r in batch.items() if step in kept], last

    async def add_grouped(self, run_id: str,
                          records: list[dict]) -> tuple[list[dict], int | None]:
        """add from the event loop, sharing a transaction with the batches other
        trainers sent while the previous one committed (group commit): under load one commit
        serves many batches instead of each waiting for its own, so the writer keeps up. A
        batch of more than GROUP_BYTES commits in pieces, each queued behind the batches that
        came meanwhile, so a trainer sending big batches delays another's by one piece at
        most. (A crash between pieces leaves the first ones committed and none acknowledged:
        the trainer's resend is idempotent.)"""
        inserted, last = [], None
        for piece, size in _pieces(records, GROUP_BYTES):
            got, last = await self._queue_commit(run_id, piece, size)
            inserted += got
        return inserted, last

    async def _queue_commit(self, run_id: str, records: list[dict],
                            size: int) -> tuple[list[dict], int | None]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting.append((run_id, records, done, size))
        if not self._committing:
            self._committing = True
            loop.create_task(self._commit_waiting())
        return await done

    async def _commit_waiting(self) -> None:
        try:
            while self._waiting:
                n, size = 0, 0          # the oldest batches, up to GROUP_BYTES (one at least)
                while n < min(len(self._waiting), GROUP_COMMIT_MAX) and \
                        (n == 0 or size + self._waiting[n][3] <= GROUP_BYTES):
                    size += self._waiting[n][3]
                    n += 1
                group = self._waiting[:n]
                del self._waiting[:n]
                try:
                    results = await self.db.run(
                        self.add_many, [(run_id, records) for run_id, records, *_ in group])
                except StoreUnavailable as e:      # every trainer keeps its records
                    results = [e] * len(group)
                except Exception:
                    # One bad batch must not fail the others: each on its own.
                    results = []
                    for run_id, records, *_ in group:
                        try:
                            results.append(await self.db.run(self.add, run_id, records))
                        except Exception as e:
                            results.append(e)
                for (_, _, done, _), result in zip(group, results):
                    if done.done():
                        continue            # its trainer went away meanwhile
                    if isinstance(result, Exception):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            self._committing = False

    # (Not @reads: the writer's, so it sees the batches queued before it.)
    def last_step(self, run_id: str) -> int | None:
        with self.db.tx() as conn:
            return conn.execute(text("SELECT MAX(step) FROM metrics WHERE run_id = :id"),
                                {"id": run_id}).scalar()

    @reads
    def usage(self, run_id: str, sample: int = 256) -> tuple[int, float]:
        """About what the run's records take, cheaply (two indexed reads, not a scan of a run
        of 1M records): how many (its step range: a trainer sends every step) and the mean
        bytes of the JSON `extra` of its newest `sample` (storage.stored_run_bytes)."""
        with self.db.tx() as conn:
            low, high = conn.execute(text("SELECT MIN(step), MAX(step) FROM metrics"
                                          " WHERE run_id = :id"), {"id": run_id}).one()
            if high is None:
                return 0, 0.0
            mean = conn.execute(text(
                "SELECT AVG(COALESCE(length(extra), 0)) FROM (SELECT extra FROM metrics"
                " WHERE run_id = :id ORDER BY step DESC LIMIT :n) newest"),
                {"id": run_id, "n": sample}).scalar()
        return int(high - low + 1), float(mean or 0)

    @reads
    def all(self, run_id: str, after: int | None = None) -> list[dict]:
        """Every record after `after`: for tests and small runs only; anything serving
        requests pages with page (a run of 1M records is ~700 MB as dicts)."""
        return self.page(run_id, after, None)

    @reads
    def card_summary(self, run_id: str, up_to: int | None = None) -> dict:
        """model_card.summary of the run's records up to step `up_to` (all: None), by four
        indexed queries instead of reading every record: the export's card costs the same
        for 10 records or 1M."""
        cap = {"id": run_id, "up_to": 2**62 if up_to is None else up_to}
        where = "FROM metrics WHERE run_id = :id AND step <= :up_to"

        def pair(column: str, order: str):
            row = conn.execute(text(f"SELECT step, {column} {where} AND {column} IS NOT NULL "
                                    f"ORDER BY {order} LIMIT 1"), cap).first()
            return None if row is None else (row[0], row[1])
        with self.db.tx() as conn:
            steps = conn.execute(text(f"SELECT MAX(step) {where}"), cap).scalar()
            return {"steps": steps or 0,
                    "loss": pair("loss", "step DESC"),
                    "eval": pair("eval_loss", "step DESC"),
                    # min() over the records in step order keeps the first of equal losses
                    "best_eval": pair("eval_loss", "eval_loss, step")}

    @reads
    def page(self, run_id: str, after: int | None, limit: int | None) -> list[dict]:
        """Up to `limit` records with step > after, in step order."""
        sql = "SELECT * FROM metrics WHERE run_id = :id AND step > :after ORDER BY step"
        with self.db.tx() as conn:
            result = conn.execute(text(sql if limit is None else sql + " LIMIT :limit"),
                                  {"id": run_id, "after": -1 if after is None else after,
                                   "limit": limit})
            keys, rows = list(result.keys()), result.all()
        # Plain tuples, not mappings: a third less of a reader thread's time (and the GIL) for
        # a viewer's backlog or a cold spike list.
        columns = [(c, keys.index(c), c in REQUIRED) for c in COLUMNS]
        extra = keys.index("extra")
        out = []
        for row in rows:
            d = {c: row[i] for c, i, required in columns if required or row[i] is not None}
            if row[extra]:
                d.update(json.loads(row[extra]))
            out.append(d)
        return out

    @reads
    def page_json(self, run_id: str, after: int | None,
                  limit: int) -> tuple[str | None, int | None, int]:
        """A viewer's backlog page, encoded here on the store thread: (the message
        {"type": "records", "records": [...]} as JSON text or None, its last step, count)."""
        page = self.page(run_id, after, limit)
        if not page:
            return None, after, 0
        return (json.dumps({"type": "records", "records": page}, allow_nan=False),
                page[-1]["step"], len(page))


def _finite(v):
    """NULL for a number that is not finite (what SQLite makes of NaN), on both databases."""
    return None if isinstance(v, float) and not math.isfinite(v) else v
