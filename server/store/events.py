"""A run's events, one per (step, kind): text samples, bandit phases, and where it was resumed
(or branched) from. Its viewers page through them (Events.page)."""

from __future__ import annotations

import json

from sqlalchemy import Connection, text

from andrea.store.engine import Database, reads

# A second event of the same step and kind replaces the first.
_PUT = text("INSERT INTO events (run_id, step, kind, data) VALUES"
            " (:run_id, :step, :kind, :data)"
            " ON CONFLICT (run_id, step, kind) DO UPDATE SET data = excluded.data")


class Events:
    """Keeps the events table."""

    def __init__(self, db: Database):
        self.db = db

    def add(self, run_id: str, step: int, kind: str, data: dict) -> None:
        with self.db.tx() as conn:
            self.put(conn, run_id, step, kind, data)

    def put(self, conn: Connection, run_id: str, step: int, kind: str, data: dict) -> None:
        """add, inside the caller's transaction."""
        conn.execute(_PUT, {"run_id": run_id, "step": step, "kind": kind,
                            "data": json.dumps(data)})

    @reads
    def all(self, run_id: str, kind: str | None = None, last: int | None = None) -> list[dict]:
        """The run's events in step order; `last`: only the newest `last` of them."""
        sql = ("SELECT step, kind, data FROM events WHERE run_id = :id"
               + (" AND kind = :kind" if kind is not None else "")
               + " ORDER BY step DESC, kind DESC" + (" LIMIT :last" if last is not None else ""))
        with self.db.tx() as conn:
            rows = conn.execute(text(f"SELECT * FROM ({sql}) e ORDER BY step, kind"),
                                {"id": run_id, "kind": kind, "last": last}).mappings().all()
        return [{"step": r["step"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    @reads
    def page(self, run_id: str, after: tuple[int, str], limit: int) -> list[dict]:
        """Up to `limit` events after (step, kind), in (step, kind) order."""
        with self.db.tx() as conn:
            rows = conn.execute(text(
                "SELECT step, kind, data FROM events WHERE run_id = :id"
                " AND (step, kind) > (:step, :kind) ORDER BY step, kind LIMIT :limit"),
                {"id": run_id, "step": after[0], "kind": after[1], "limit": limit}
            ).mappings().all()
        return [{"step": r["step"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    def sample_usage(self, run_id: str) -> tuple[int, int]:
        """The run's stored samples: how many, and their bytes as stored (their JSON, which is
        ASCII: length() counts bytes in both databases). What its sample quota starts from."""
        with self.db.tx() as conn:
            count, size = conn.execute(text(
                "SELECT COUNT(*), COALESCE(SUM(length(data)), 0) FROM events"
                " WHERE run_id = :id AND kind = 'sample'"), {"id": run_id}).one()
        return int(count), int(size)

    @reads
    def resume_count(self, run_id: str) -> int:
        """How many times the run was resumed: a viewer that reads its backlog compares it
        before and after (telemetry/viewer.py)."""
        with self.db.tx() as conn:
            return conn.execute(text("SELECT COUNT(*) FROM events WHERE run_id = :id"
                                     " AND kind = 'resumed'"), {"id": run_id}).scalar()

    @reads
    def first_resume_after(self, run_id: str, step: int) -> int | None:
        """The lowest step < `step` that the run was resumed from (None: none): a viewer
        that had records up to `step` may hold stale ones after it."""
        with self.db.tx() as conn:
            return conn.execute(text("SELECT MIN(step) FROM events WHERE run_id = :id"
                                     " AND kind = 'resumed' AND step < :step"),
                                {"id": run_id, "step": step}).scalar()
