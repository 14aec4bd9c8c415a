"""The run summary, kept on the run's row: its last step and loss, when its first and last
records were committed (elapsed time), and its last and best eval losses; what the runs list
shows of each run. The transaction that commits records updates it (Summaries.add: Metrics.add,
the group commit too, from the rows it really inserted; a branch's copied pages, add_copied),
so listing runs reads their rows alone and costs the same however many records they hold.
Where records go in bulk it is computed again from them, for that run (refresh: a resume cuts
a run back to its checkpoint); an older database computes it once for every run when it gains
the columns (refresh_all, schema.py).

Its values are those of the records: last_step MAX(step); last_loss and last_time the loss and
time of that step's record; first_time the lowest step's time; last_eval_loss the eval loss of
the highest step that has one; best_eval_loss MIN(eval_loss). Two more columns are its own
(first_step, last_eval_step: what a new batch is compared with), never shown."""

from __future__ import annotations

import time

from sqlalchemy import Connection, Row, text

SHOWN = ("last_step", "last_loss", "first_time", "last_time", "last_eval_loss",
         "best_eval_loss")
OWN = ("first_step", "last_eval_step")


def _of_records(where: str = "") -> str:
    run = "FROM metrics m WHERE m.run_id = runs.id"
    return (
        f"UPDATE runs SET last_step = (SELECT MAX(step) {run}),"
        f" first_step = (SELECT MIN(step) {run}),"
        f" last_loss = (SELECT loss {run} ORDER BY step DESC LIMIT 1),"
        f" first_time = (SELECT time {run} ORDER BY step LIMIT 1),"
        f" last_time = (SELECT time {run} ORDER BY step DESC LIMIT 1),"
        f" last_eval_step = (SELECT step {run} AND eval_loss IS NOT NULL"
        " ORDER BY step DESC LIMIT 1),"
        f" last_eval_loss = (SELECT eval_loss {run} AND eval_loss IS NOT NULL"
        " ORDER BY step DESC LIMIT 1),"
        f" best_eval_loss = (SELECT MIN(eval_loss) {run})" + where)


# From the records: every run's (once, when the columns are added), or one run's (:id).
_REFRESH_ALL = text(_of_records())
_REFRESH_RUN = text(_of_records(" WHERE id = :id"))

# A batch's inserted rows folded into the summary, with the run's updated_at; it returns the
# run's last step (Metrics.add's answer). Each SET reads the row as it was before the UPDATE.
# CAST: PostgreSQL cannot type a bare parameter compared with NULL.
_STEP, _REAL = "BIGINT", "DOUBLE PRECISION"


def _p(name: str, sql_type: str) -> str:
    return f"CAST(:{name} AS {sql_type})"


_LATER = f"last_step IS NULL OR last_step < {_p('last_step', _STEP)}"
_EARLIER = f"first_step IS NULL OR first_step > {_p('first_step', _STEP)}"
_EVAL = (f"{_p('eval_step', _STEP)} IS NOT NULL AND (last_eval_step IS NULL"
         f" OR last_eval_step < {_p('eval_step', _STEP)})")
_BEST = f"best_eval_loss IS NULL OR best_eval_loss > {_p('best_eval', _REAL)}"


def _set(column: str, when: str, name: str, sql_type: str) -> str:
    return f"{column} = CASE WHEN {when} THEN {_p(name, sql_type)} ELSE {column} END"


_ADD = text(
    "UPDATE runs SET updated_at = :now, "
    + ", ".join([
        _set("last_step", _LATER, "last_step", _STEP),
        _set("last_loss", _LATER, "last_loss", _REAL),
        _set("last_time", _LATER, "last_time", _REAL),
        _set("first_step", _EARLIER, "first_step", _STEP),
        _set("first_time", _EARLIER, "first_time", _REAL),
        _set("last_eval_step", _EVAL, "eval_step", _STEP),
        _set("last_eval_loss", _EVAL, "eval_loss", _REAL),
        _set("best_eval_loss", _BEST, "best_eval", _REAL),
    ])
    + " WHERE id = :run_id RETURNING last_step")
# A batch that inserted nothing (all resent): the run's updated_at only.
_TOUCH = text("UPDATE runs SET updated_at = :now WHERE id = :run_id RETURNING last_step")


def _batch(rows: list[dict]) -> dict:
    """_ADD's parameters for the rows a batch really inserted (at least one), in step order, as
    stored (non-finite numbers already NULL)."""
    first, last = rows[0], rows[-1]
    evals = [r for r in rows if r["eval_loss"] is not None]
    return {"first_step": first["step"], "first_time": first["time"],
            "last_step": last["step"], "last_loss": last["loss"], "last_time": last["time"],
            "eval_step": evals[-1]["step"] if evals else None,
            "eval_loss": evals[-1]["eval_loss"] if evals else None,
            "best_eval": min(r["eval_loss"] for r in evals) if evals else None}


# The rows a branch's page copied (after the branch's step :after), folded in as a batch's.
_PAGE = "FROM metrics WHERE run_id = :run_id AND step > :after"
_PAGE_FIRST = text(f"SELECT step, time {_PAGE} ORDER BY step LIMIT 1")
_PAGE_LAST = text(f"SELECT step, loss, time {_PAGE} ORDER BY step DESC LIMIT 1")
_PAGE_EVAL = text(f"SELECT step, eval_loss {_PAGE} AND eval_loss IS NOT NULL"
                  " ORDER BY step DESC LIMIT 1")
_PAGE_BEST = text(f"SELECT MIN(eval_loss) {_PAGE}")


class Summaries:
    """Keeps the runs' summaries in step with their records, each change inside the
    transaction of the records' own (the caller's connection): it holds no database of its
    own."""

    def add(self, conn: Connection, run_id: str, rows: list[dict]) -> Row | None:
        """The run's updated_at, and its summary with the rows a batch really inserted (none:
        updated_at alone). Returns the run's row as (last_step,); None for an unknown run."""
        ids = {"now": time.time(), "run_id": run_id}
        return (conn.execute(_ADD, {**ids, **_batch(rows)}) if rows
                else conn.execute(_TOUCH, ids)).first()

    def add_copied(self, conn: Connection, run_id: str, after: int) -> None:
        """The run's summary with the records just copied into it after step `after` (a
        branch's page: at least one), as a batch's records would: no step reads all of them."""
        page = {"run_id": run_id, "after": after}
        first, last = (conn.execute(q, page).first() for q in (_PAGE_FIRST, _PAGE_LAST))
        evals = conn.execute(_PAGE_EVAL, page).first()
        conn.execute(_ADD, {
            "now": time.time(), "run_id": run_id, "first_step": first.step,
            "first_time": first.time, "last_step": last.step, "last_loss": last.loss,
            "last_time": last.time, "eval_step": evals and evals.step,
            "eval_loss": evals and evals.eval_loss,
            "best_eval": conn.execute(_PAGE_BEST, page).scalar()})

    def refresh(self, conn: Connection, run_id: str) -> None:
        """The run's summary computed again from its records (a resume cut them back)."""
        conn.execute(_REFRESH_RUN, {"id": run_id})

    def refresh_all(self, conn: Connection) -> None:
        """Every run's summary computed from its records (an older database gained the
        columns)."""
        conn.execute(_REFRESH_ALL)
