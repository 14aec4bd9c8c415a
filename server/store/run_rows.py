"""Run rows: create, read, list, rename/tag/annotate, delete, status, checkpoint step, the
trainer's write token (and the ones a resume revoked), resume and branch, and expiring runs
that never started. A run's row carries its summary (summary.py), so reading or listing runs
never reads their records."""

from __future__ import annotations

import json
import time

from sqlalchemy import Connection, Text, bindparam, text

from andrea.metrics import COLUMNS
from andrea.run_config import StoredRunConfig, model_name, read_stored, stored_json
from andrea.store.engine import Database, reads
from andrea.store.events import Events
from andrea.store.summary import OWN, Summaries
from andrea.write_tokens import token_hash, token_matches

# A branch copies its parent's rows up to its step a page at a time, each page its own short
# write transaction, going on after the last row it copied (the branch's own newest).
# CAST: PostgreSQL cannot type a bare parameter in a SELECT list.
BRANCH_PAGE = 20_000
_COPY_METRICS = text(
    f"INSERT INTO metrics (run_id, {', '.join(COLUMNS)}, extra)"
    f" SELECT CAST(:run_id AS TEXT), {', '.join(COLUMNS)}, extra FROM metrics"
    " WHERE run_id = :parent AND step > :after AND step <= :step ORDER BY step LIMIT :limit")
_LAST_EVENT = text("SELECT step, kind FROM events WHERE run_id = :run_id"
                   " ORDER BY step DESC, kind DESC LIMIT 1")
_COPY_EVENTS = text(
    "INSERT INTO events (run_id, step, kind, data)"
    " SELECT CAST(:run_id AS TEXT), step, kind, data FROM events"
    " WHERE run_id = :parent AND step <= :step AND kind != 'resumed'"
    " AND (step, kind) > (:after_step, :after_kind) ORDER BY step, kind LIMIT :limit")
_ABANDON = text(
    "UPDATE runs SET status = 'abandoned', message = :message WHERE status = 'created'"
    " AND updated_at < :before AND checkpoint_step IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = runs.id)"
    " AND id NOT IN :connected RETURNING id"
).bindparams(bindparam("connected", expanding=True, type_=Text))
# The next run number: one past both the counter and the runs' own numbers (a database older
# than the counter, or written by an older server, has runs it never counted). On PostgreSQL
# the counter's row lock serializes two servers creating runs at once: no number is given twice.
_NEXT_NUMBER = text(
    "INSERT INTO counters (name, value) VALUES ('run_number', CAST(:top AS BIGINT) + 1)"
    " ON CONFLICT (name) DO UPDATE SET value = CASE WHEN counters.value > CAST(:top AS BIGINT)"
    " THEN counters.value ELSE CAST(:top AS BIGINT) END + 1 RETURNING value")
# What is never shown of a run's row: the token's hash, its number, the summary's own columns.
_HIDDEN = ("token_sha256", "number", "copying_from", *OWN)


class Runs:
    """Keeps the runs table (and the revoked tokens); a resume's or a branch's events with
    `events`, their summaries with `summaries`."""

    def __init__(self, db: Database, summaries: Summaries, events: Events):
        self.db = db
        self.summaries = summaries
        self.events = events

    def create(self, run_id: str, config: StoredRunConfig, token_sha256: str,
               name: str | None = None) -> None:
        with self.db.tx(write=True) as conn:
            self._insert(conn, run_id, config, token_sha256, name)

    def _insert(self, conn: Connection, run_id: str, config: StoredRunConfig,
                token_sha256: str, name: str | None, checkpoint_step: int | None = None) -> None:
        """A new `created` row (inside the caller's transaction), named "tiny adamw #12" by
        default: the preset, the optimizer and the run's number on this server, never one a
        deleted run had."""
        top = conn.execute(text("SELECT COALESCE(MAX(number), 0) FROM runs")).scalar()
        number = conn.execute(_NEXT_NUMBER, {"top": top}).scalar()
        now = time.time()
        conn.execute(text(
            "INSERT INTO runs (id, created_at, updated_at, config, token_sha256, status,"
            " checkpoint_step, name, tags, number) VALUES (:id, :now, :now, :config, :token,"
            " 'created', :checkpoint_step, :name, '[]', :number)"),
            {"id": run_id, "now": now, "config": stored_json(config), "token": token_sha256,
             "checkpoint_step": checkpoint_step, "number": number,
             "name": name or f"{model_name(config)} {config.optimizer} #{number}"})

    @reads
    def get(self, run_id: str) -> dict | None:
        with self.db.tx() as conn:
            row = conn.execute(text("SELECT * FROM runs WHERE id = :id"),
                               {"id": run_id}).mappings().first()
        return run_dict(row) if row else None

    @reads
    def page(self, limit: int = 200, before: tuple[float, str] | None = None) -> list[dict]:
        """The newest `limit` runs, newest first (created_at, then id); `before`: those after
        the (created_at, id) of the last run of the previous page. Their rows alone, read by
        the index on (created_at, id), whatever records they hold. A branch still being made
        is not listed."""
        after = "" if before is None else " AND (created_at, id) < (:created_at, :id)"
        with self.db.tx() as conn:
            rows = conn.execute(text(
                f"SELECT * FROM runs WHERE copying_from IS NULL{after}"
                " ORDER BY created_at DESC, id DESC LIMIT :limit"),
                {"limit": limit, "created_at": before and before[0],
                 "id": before and before[1]}).mappings().all()
        return [run_dict(r) for r in rows]

    def count(self, listed: bool = False) -> int:
        """Every stored run (branches being made too): what Settings.max_runs bounds; `listed`:
        those the runs list shows (its X-Total-Count), without the branches being made."""
        where = " WHERE copying_from IS NULL" if listed else ""
        with self.db.tx() as conn:
            return conn.execute(text(f"SELECT count(*) FROM runs{where}")).scalar()

    def update(self, run_id: str, fields: dict) -> bool:
        """Sets the given name, tags (a list) and notes; False for an unknown run."""
        values = {k: json.dumps(v) if k == "tags" else v for k, v in fields.items()
                  if k in ("name", "tags", "notes")}
        with self.db.tx() as conn:
            if not values:
                return conn.execute(text("SELECT 1 FROM runs WHERE id = :id"),
                                    {"id": run_id}).first() is not None
            sets = ", ".join(f"{k} = :{k}" for k in values)
            return conn.execute(text(f"UPDATE runs SET {sets}, updated_at = :now WHERE id = :id"),
                                {**values, "now": time.time(), "id": run_id}).rowcount == 1

    def delete(self, run_id: str) -> bool:
        """The run's row, metrics, events and revoked tokens, in one transaction; False for an
        unknown run. (Its files are the caller's: checkpoints and weights.)"""
        with self.db.tx(write=True) as conn:
            self.db.lock_run(conn, run_id)
            for table in ("metrics", "events", "revoked_tokens"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_id = :id"), {"id": run_id})
            return conn.execute(text("DELETE FROM runs WHERE id = :id"),
                                {"id": run_id}).rowcount == 1

    def awaiting_trainer(self) -> list[str]:
        """Runs a training tab should be at: running, paused, or created from a checkpoint
        (resumed, branched) and not yet started (runs/lifecycle.py watch_runs_left)."""
        with self.db.tx() as conn:
            return sorted(conn.execute(text(
                "SELECT id FROM runs WHERE status IN ('running', 'paused')"
                " OR (status = 'created' AND checkpoint_step IS NOT NULL)")).scalars())

    def abandon_stale(self, before: float, connected: tuple[str, ...],
                      message: str) -> list[str]:
        """Runs still `created` since before `before` that never recorded a step, have no
        checkpoint and no trainer now become `abandoned` (never started). Returns their ids
        (their viewers are told)."""
        with self.db.tx() as conn:
            return sorted(conn.execute(_ABANDON, {"message": message, "before": before,
                                                  "connected": list(connected)}).scalars())

    def get_with_token(self, run_id: str) -> dict | None:
        with self.db.tx() as conn:
            row = conn.execute(text("SELECT id, token_sha256, status FROM runs WHERE id = :id"),
                               {"id": run_id}).mappings().first()
        return dict(row) if row else None

    # (Not @reads: the writer's, so it sees a resume queued before it.)
    def check_token(self, run_id: str, token: str) -> str | None:
        """"ok", "revoked" (a resume replaced it), "wrong", or None for an unknown run."""
        row = self.get_with_token(run_id)
        if row is None:
            return None
        if token_matches(row["token_sha256"], token):
            return "ok"
        with self.db.tx() as conn:
            revoked = conn.execute(text("SELECT 1 FROM revoked_tokens WHERE run_id = :id"
                                        " AND token_sha256 = :token"),
                                   {"id": run_id, "token": token_hash(token)}).first()
        return "revoked" if revoked else "wrong"

    def set_status(self, run_id: str, status: str, message: str | None = None,
                   adapter: dict | None = None, keep: tuple[str, ...] = (),
                   only: tuple[str, ...] = ()) -> str | None:
        """Sets the status unless the run's status is in `keep` (and differs), or `only` is
        given and the status is not in it: then nothing changes. Returns the status the run has
        afterwards (None: unknown run)."""
        with self.db.tx(write=True) as conn:
            row = self.db.lock_run(conn, run_id, "status")
            if row is None:
                return None
            if (row["status"] in keep and row["status"] != status
                    or only and row["status"] not in only):
                return row["status"]
            conn.execute(text(
                "UPDATE runs SET status = :status, message = COALESCE(:message, message),"
                " adapter = COALESCE(:adapter, adapter), updated_at = :now WHERE id = :id"),
                {"status": status, "message": message,
                 "adapter": json.dumps(adapter) if adapter else None, "now": time.time(),
                 "id": run_id})
        return status

    def set_checkpoint_step(self, run_id: str, step: int | None) -> None:
        with self.db.tx() as conn:
            conn.execute(text("UPDATE runs SET checkpoint_step = :step WHERE id = :id"),
                         {"step": step, "id": run_id})

    @reads
    def checkpoint_steps(self) -> dict[str, int]:
        with self.db.tx() as conn:
            rows = conn.execute(text("SELECT id, checkpoint_step FROM runs"
                                     " WHERE checkpoint_step IS NOT NULL")).all()
        return {run_id: step for run_id, step in rows}

    # ---- resume and branch --------------------------------------------------------------
    def resume(self, run_id: str, step: int, token_sha256: str,
               resumable: tuple[str, ...]) -> str | None:
        """One transaction: the old token revoked and the new one set, metrics and events after
        `step` deleted (the run's summary with them), a `resumed` event, status `created`.
        Returns why not (a reason) when the run's status is not in `resumable` (then nothing
        changed), else None."""
        with self.db.tx(write=True) as conn:    # the lock first: two resumes serialize
            row = self.db.lock_run(conn, run_id, "status, token_sha256")
            if row is None:
                return f"unknown run {run_id!r}"
            if row["status"] not in resumable:
                return f"the run is {row['status']}"
            ids = {"run_id": run_id, "step": step}
            conn.execute(text("INSERT INTO revoked_tokens (run_id, token_sha256)"
                              " VALUES (:run_id, :token) ON CONFLICT DO NOTHING"),
                         {"run_id": run_id, "token": row["token_sha256"]})
            conn.execute(text("DELETE FROM metrics WHERE run_id = :run_id AND step > :step"), ids)
            conn.execute(text("DELETE FROM events WHERE run_id = :run_id AND step > :step"), ids)
            self.events.put(conn, run_id, step, "resumed", {})
            conn.execute(text(
                "UPDATE runs SET token_sha256 = :token, status = 'created', message = NULL,"
                " checkpoint_step = :step, updated_at = :now WHERE id = :run_id"),
                {**ids, "token": token_sha256, "now": time.time()})
            self.summaries.refresh(conn, run_id)
        return None

    # A branch: a new run that starts after the parent's step `step`, the parent's metrics and
    # events up to it copied (charts and the bandit's replay go on from there), a `resumed`
    # event naming the parent, its checkpoint step set. The copy goes a page (BRANCH_PAGE
    # rows) at a time, each its own short write transaction, so trainers' commits go on between
    # pages (SQLite: every call is its own job on the store's one thread); the row, marked
    # `copying_from`, is listed once the last transaction finds the parent unchanged. A process
    # killed mid-copy leaves it marked: never listed (nor in the list's total), dropped by the app
    # (unfinished_branches; runs/sweep.py drop_unfinished_branches).
    def create_branch(self, run_id: str, config: StoredRunConfig, token_sha256: str,
                      parent_id: str, step: int, name: str | None = None) -> str | None:
        """The branch, made on the calling thread. Returns why not (the parent unknown,
        deleted or resumed meanwhile; nothing of the branch is left), else None."""
        mark = self.begin_branch(run_id, config, token_sha256, parent_id, step, name)
        if mark is None:
            return f"unknown run {parent_id!r}"
        try:
            while self.copy_branch_page(run_id, parent_id, step):
                pass
            reason = self.end_branch(run_id, parent_id, step, mark)
        except BaseException:
            while self.drop_branch_page(run_id):
                pass
            raise
        while reason and self.drop_branch_page(run_id):
            pass
        return reason

    async def branch(self, run_id: str, config: StoredRunConfig, token_sha256: str,
                     parent_id: str, step: int, name: str | None = None) -> str | None:
        """create_branch from the event loop: each transaction a job of its own on the
        store's threads, other work between them."""
        mark = await self.db.run(self.begin_branch, run_id, config, token_sha256, parent_id,
                                 step, name)
        if mark is None:
            return f"unknown run {parent_id!r}"
        try:
            while await self.db.run(self.copy_branch_page, run_id, parent_id, step):
                pass
            reason = await self.db.run(self.end_branch, run_id, parent_id, step, mark)
        except BaseException:
            while await self.db.run(self.drop_branch_page, run_id):
                pass
            raise
        while reason and await self.db.run(self.drop_branch_page, run_id):
            pass
        return reason

    def begin_branch(self, run_id: str, config: StoredRunConfig, token_sha256: str,
                     parent_id: str, step: int, name: str | None = None) -> str | None:
        """The branch's row, not listed yet (copying_from). Returns the parent's token hash
        now (a resume changes it: end_branch compares), or None for an unknown parent."""
        with self.db.tx(write=True) as conn:
            parent = self.db.lock_run(conn, parent_id, "token_sha256")
            if parent is None:
                return None
            self._insert(conn, run_id, config, token_sha256, name, checkpoint_step=step)
            conn.execute(text("UPDATE runs SET copying_from = :parent WHERE id = :id"),
                         {"parent": parent_id, "id": run_id})
        return parent["token_sha256"]

    def copy_branch_page(self, run_id: str, parent_id: str, step: int,
                         limit: int = BRANCH_PAGE) -> int:
        """Copies the next page of the parent's metrics up to `step` (the branch's summary
        gains them as a batch's records would: no step reads all of them), or once they are
        all copied, of its events. Returns the rows copied: 0 when the copy is complete."""
        copy = {"run_id": run_id, "parent": parent_id, "step": step, "limit": limit}
        with self.db.tx(write=True) as conn:
            after = conn.execute(text("SELECT MAX(step) FROM metrics WHERE run_id = :run_id"),
                                 copy).scalar()
            copy["after"] = -1 if after is None else after
            n = conn.execute(_COPY_METRICS, copy).rowcount
            if n:
                self.summaries.add_copied(conn, run_id, copy["after"])
            else:
                last = conn.execute(_LAST_EVENT, copy).first()
                n = conn.execute(_COPY_EVENTS, {**copy, "after_step": last[0] if last else -1,
                                                "after_kind": last[1] if last else ""}).rowcount
                # (A metrics page sets it with the summary: every page shows the copy is alive.)
                conn.execute(text("UPDATE runs SET updated_at = :now WHERE id = :run_id"),
                             {"now": time.time(), "run_id": run_id})
        return n

    def end_branch(self, run_id: str, parent_id: str, step: int, mark: str) -> str | None:
        """The branch made whole and listed, if its parent is as it was when the copy began
        (`mark`, begin_branch's answer); else why not (the caller drops the branch)."""
        with self.db.tx(write=True) as conn:
            parent = self.db.lock_run(conn, parent_id, "token_sha256")
            if parent is None:
                return f"run {parent_id} was deleted while the branch copied its records"
            if parent["token_sha256"] != mark:
                # A resume deletes the records after its checkpoint, which may be before `step`.
                return (f"run {parent_id} was resumed while the branch copied its records up to "
                        f"step {step}, which may have changed them: branch it again")
            if not conn.execute(text("UPDATE runs SET copying_from = NULL WHERE id = :id"),
                                {"id": run_id}).rowcount:
                return ("the branch's copy stalled so long that it was taken for one a stopped "
                        "server left, and dropped: branch it again")
            self.events.put(conn, run_id, step, "resumed", {"parent": parent_id})
        return None

    def unfinished_branches(self, before: float | None = None) -> list[str]:
        """Branches being made (copying_from) whose copy last moved before `before` (None: all
        of them): those a process left when it died mid-copy (kill -9, a crash, a power cut),
        never to be listed. The caller drops them (drop_branch_page) and their files. A live
        copy moves every page (each page sets the branch's updated_at)."""
        with self.db.tx() as conn:
            return sorted(conn.execute(text(
                "SELECT id FROM runs WHERE copying_from IS NOT NULL"
                + ("" if before is None else " AND updated_at < :before")),
                {"before": before}).scalars())

    def drop_branch_page(self, run_id: str, limit: int = BRANCH_PAGE) -> int:
        """Deletes a page of a failed branch's metrics; once none is left, its events and row.
        Returns the rows deleted: 0 when the branch is gone."""
        with self.db.tx(write=True) as conn:
            # The page's last step, then a range of the primary key: both walk its index. (A
            # DELETE ... IN (SELECT ... LIMIT) could be planned on PostgreSQL, with the table's
            # statistics not yet updated after its bulk inserts, as a join that rescans the
            # table per row: minutes for 100k rows, in one write transaction.)
            last = conn.execute(text(
                "SELECT MAX(step) FROM (SELECT step FROM metrics WHERE run_id = :id"
                " ORDER BY step LIMIT :limit) AS page"), {"id": run_id, "limit": limit}).scalar()
            n = 0 if last is None else conn.execute(text(
                "DELETE FROM metrics WHERE run_id = :id AND step <= :last"),
                {"id": run_id, "last": last}).rowcount
            if n == 0:
                for table in ("events", "revoked_tokens", "runs"):
                    column = "id" if table == "runs" else "run_id"
                    n += conn.execute(text(f"DELETE FROM {table} WHERE {column} = :id"),
                                      {"id": run_id}).rowcount
        return n


def run_dict(row) -> dict:
    """A run's row as the store hands it out: JSON decoded (its config a StoredRunConfig), a
    default name, nothing hidden."""
    d = dict(row)
    for column in _HIDDEN:
        d.pop(column, None)
    # (A run stored before clip_mode or custom shapes reads back with them: read_stored.)
    d["config"] = read_stored(d["config"])
    d["adapter"] = json.loads(d["adapter"]) if d["adapter"] else None
    d["tags"] = json.loads(d["tags"]) if d.get("tags") else []
    d["name"] = d.get("name") or f"{model_name(d['config'])} {d['config'].optimizer}"
    return d
