"""The runs list at workshop scale: 1,000 runs of 10,000 records each (ten million rows, made in
SQLite by one INSERT ... SELECT, then summarized by the store's own migration, as an older
database is when it opens) are listed with the same work as the same runs with 10 records
each: listing reads the runs' rows alone (the summary each row carries: andrea.store.summary),
and committing a record does not read the run's other records either. The work is counted in
SQLite virtual-machine instructions, the same on every machine, never timed."""

from __future__ import annotations

import json
import sqlite3

import pytest
from sqlalchemy import create_engine

from andrea.store import META, Store
from andrea.store.summary import OWN, SHOWN
from tests.trainer_client import stored_config

CFG = stored_config().model_dump()          # a run's config as its row holds it
RUNS = 1000
BIG, SMALL = 10_000, 10
EVAL_EVERY = 500


def _older_database(path, records: int) -> None:
    """A database from before the run summary, with RUNS runs of `records` records each (loss
    number + 1/step, time 2000 + step, an eval loss every EVAL_EVERY steps)."""
    path.parent.mkdir(parents=True)
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as db:
        META.create_all(db)
        for column in SHOWN + OWN:
            db.exec_driver_sql(f"ALTER TABLE runs DROP COLUMN {column}")
    engine.dispose()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")         # a throwaway file: made fast, whole or not
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
        " INSERT INTO runs (id, created_at, updated_at, config, token_sha256, status, name,"
        " tags, number) SELECT printf('%012x', i), 1000.0 + i, 1000.0 + i, ?, 'h', 'finished',"
        " 'run ' || i, '[]', i FROM n", (RUNS, json.dumps(CFG)))
    # Run by run (CROSS JOIN: runs outside), each in step order: appended, never reshuffled.
    conn.execute(
        "WITH RECURSIVE s(step) AS (SELECT 1 UNION ALL SELECT step + 1 FROM s WHERE step < ?)"
        " INSERT INTO metrics (run_id, step, loss, time, eval_loss)"
        " SELECT r.id, s.step, r.number + 1.0 / s.step, 2000.0 + s.step,"
        " CASE WHEN s.step % ? = 0 THEN r.number + 10.0 / s.step END"
        " FROM runs r CROSS JOIN s", (records, EVAL_EVERY))
    conn.execute("COMMIT")
    conn.close()


def _instructions(store: Store, fn, *args) -> int:
    """How many SQLite VM instructions `fn` (a store method, run on this thread) executes."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0
    conn = store.db.sqlite_connection()        # this thread's connection: the one fn uses here
    conn.set_progress_handler(tick, 1)
    try:
        fn(*args)
    finally:
        conn.set_progress_handler(None, 1)
    return count


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same runs with SMALL and with BIG records each: {records: Store}."""
    root = tmp_path_factory.mktemp("scale")
    opened = {}
    try:
        for records in (SMALL, BIG):
            path = root / str(records) / "andrea.sqlite"
            _older_database(path, records)
            opened[records] = Store(path)       # adds the summary, computed from the records
        yield opened
    finally:
        for store in opened.values():
            store.close()


def test_the_migration_summarized_every_run(stores):
    runs = stores[BIG].runs.page(RUNS)
    assert len(runs) == RUNS and runs[0]["id"] == f"{RUNS:012x}"        # newest first
    for run in (runs[0], runs[RUNS // 2], runs[-1]):
        n = int(run["id"], 16)
        assert run["last_step"] == BIG and run["last_loss"] == pytest.approx(n + 1 / BIG)
        assert (run["first_time"], run["last_time"]) == (2001.0, 2000.0 + BIG)
        assert run["last_eval_loss"] == pytest.approx(n + 10 / BIG)
        assert run["best_eval_loss"] == pytest.approx(n + 10 / BIG)
    small = stores[SMALL].runs.get(runs[-1]["id"])
    assert (small["last_step"], small["last_time"], small["best_eval_loss"]) == \
        (SMALL, 2000.0 + SMALL, None)


def test_listing_runs_costs_the_same_whatever_records_they_hold(stores):
    work = {records: _instructions(store, store.runs.page, RUNS)
            for records, store in stores.items()}
    # A thousand times the records, the same work (within a little: the rows' numbers).
    assert work[BIG] <= 1.05 * work[SMALL], work
    # Reading one run too.
    run_id = f"{RUNS // 2:012x}"
    work = {records: _instructions(store, store.runs.get, run_id)
            for records, store in stores.items()}
    assert work[BIG] <= 1.05 * work[SMALL], work


def test_committing_records_does_not_read_the_runs_other_records(stores):
    run_id = f"{RUNS // 2:012x}"
    work = {}
    for records, store in stores.items():
        record = {"step": BIG + 1, "loss": 0.5, "grad_norm": 1.0, "clip_scale": 1.0,
                  "lr": 1e-3, "eval_loss": 0.25}
        work[records] = _instructions(store, store.metrics.add, run_id, [record])
        run = store.runs.get(run_id)
        assert (run["last_step"], run["last_loss"], run["best_eval_loss"]) == \
            (BIG + 1, 0.5, 0.25)
    assert work[BIG] <= 1.5 * work[SMALL], work
