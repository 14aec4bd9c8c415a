"""Run rows: create, read, list, rename/tag/annotate, delete, status, checkpoint step, the
trainer's write token (and the ones a resume revoked), resume and branch, and expiring runs
that never started. A run's row carries its summary (summary.py), so reading or listing runs
never reads their records."""

from __future__ import annotations

import json
import time

from sqlalchemy import Connection, Text, bindparam, text

from andrea.auth import token_hash, token_matches
from andrea.metrics import COLUMNS
from andrea.model import model_name, with_shape
from andrea.store.events import PUT_EVENT
from andrea.store.summary import OWN, REFRESH_RUN

# CAST: PostgreSQL cannot type a bare parameter in a SELECT list.
_COPY_METRICS = text(f"INSERT INTO metrics (run_id, {', '.join(COLUMNS)}, extra)"
                     f" SELECT CAST(:run_id AS TEXT), {', '.join(COLUMNS)}, extra FROM metrics"
                     " WHERE run_id = :parent AND step <= :step")
_COPY_EVENTS = text("INSERT INTO events (run_id, step, kind, data)"
                    " SELECT CAST(:run_id AS TEXT), step, kind, data FROM events"
                    " WHERE run_id = :parent AND step <= :step AND kind != 'resumed'")
_ABANDON = text(
    "UPDATE runs SET status = 'abandoned', message = :message WHERE status = 'created'"
    " AND updated_at < :before AND checkpoint_step IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = runs.id)"
    " AND id NOT IN :connected RETURNING id"
).bindparams(bindparam("connected", expanding=True, type_=Text))
# What is never shown of a run's row: the token's hash, its number, the summary's own columns.
_HIDDEN = ("token_sha256", "number", *OWN)


class Runs:
    """The Store's part that keeps the runs table."""

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
            row = db.execute(text("SELECT * FROM runs WHERE id = :id"),
                             {"id": run_id}).mappings().first()
        return run_dict(row) if row else None

    def list_runs(self, limit: int = 200) -> list[dict]:
        """The newest `limit` runs: their rows alone, whatever records they hold."""
        with self._tx() as db:
            rows = db.execute(text("SELECT * FROM runs ORDER BY created_at DESC LIMIT :limit"),
                              {"limit": limit}).mappings().all()
        return [run_dict(r) for r in rows]

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
        `step` deleted (the run's summary with them), a `resumed` event, status `created`.
        Returns why not (a reason) when the run's status is not in `resumable` (then nothing
        changed), else None."""
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
            db.execute(PUT_EVENT, {**ids, "kind": "resumed", "data": "{}"})
            db.execute(text(
                "UPDATE runs SET token_sha256 = :token, status = 'created', message = NULL,"
                " checkpoint_step = :step, updated_at = :now WHERE id = :run_id"),
                {**ids, "token": token_sha256, "now": time.time()})
            db.execute(REFRESH_RUN, {"id": run_id})
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
            db.execute(PUT_EVENT, {"run_id": run_id, "step": step, "kind": "resumed",
                                   "data": json.dumps({"parent": parent_id})})
            db.execute(REFRESH_RUN, {"id": run_id})


def run_dict(row) -> dict:
    """A run's row as the store hands it out: JSON decoded, a default name, nothing hidden."""
    d = dict(row)
    for column in _HIDDEN:
        d.pop(column, None)
    d["config"] = with_shape(json.loads(d["config"]))
    d["adapter"] = json.loads(d["adapter"]) if d["adapter"] else None
    d["tags"] = json.loads(d["tags"]) if d.get("tags") else []
    d["name"] = d.get("name") or f"{model_name(d['config'])} {d['config']['optimizer']}"
    return d
