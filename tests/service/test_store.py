"""The store (server/store/) on both of its databases: every test runs on SQLite and on
PostgreSQL (a throwaway cluster, tests/pg.py; skipped where PostgreSQL is not installed)."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import text

from andrea.metrics import COLUMNS
from andrea.run_config import RunConfig, StoredRunConfig
from andrea.store import Store, StoreUnavailable, engine_url
from tests import aio
from tests.trainer_client import store_old_config, stored_config

CFG = stored_config()
RESUMABLE = ("running", "stopped", "interrupted", "failed")


class Backend:
    """Opens Stores on one database: the test's SQLite file, or its PostgreSQL database."""

    def __init__(self, name: str, tmp_path, url: str | None, cluster=None):
        self.name, self.url, self.cluster = name, url, cluster
        self.path = tmp_path / "data" / "andrea.sqlite"

    def open(self) -> Store:
        return Store.open(self.url, self.path)

    @contextmanager
    def holding_the_lock(self, run_id: str):
        """Another connection holding what a serialized write waits for: SQLite's write lock
        (BEGIN IMMEDIATE), PostgreSQL's lock on the run's row (FOR UPDATE)."""
        if self.url is None:
            conn = sqlite3.connect(self.path, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn = psycopg.connect(self.url)
            conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (run_id,))
        try:
            yield
        finally:
            conn.commit()
            conn.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request, tmp_path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", tmp_path, None)
    return Backend("postgresql", tmp_path, request.getfixturevalue("pg_url"),
                   request.getfixturevalue("pg_cluster"))


@pytest.fixture
def store(store_backend):
    s = store_backend.open()
    yield s
    s.close()


def rec(step: int, loss: float | None = 5.0, **more) -> dict:
    return {"step": step, "loss": loss, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3, **more}


def steps(records: list[dict]) -> list[int]:
    return [r["step"] for r in records]


# ---- runs ------------------------------------------------------------------------------------


def test_runs_are_created_read_listed_and_named(store):
    # "a" as a server stored it before a run could give its own shape: none of its fields.
    old = {"preset": "tiny", "optimizer": "adamw", "seq_len": 64, "warmup_steps": 20,
           "corpus_hash": ""}
    store_old_config(store, "a", old, "hash-a")
    store.runs.create("b", stored_config(optimizer="adamw_8bit"), "hash-b", "my run")
    store.runs.create("c", CFG, "hash-c")
    a = store.runs.get("a")
    # Read back with every shape field filled in from the preset (runs stored before a run
    # could give its own shape have none), RunConfig's defaults for the fields it lacks.
    assert a["config"].model_dump() == {**CFG.model_dump(), **old, "n_layer": 2, "n_embd": 64,
                                        "n_head": 4, "ffn_dim": 192, "vocab_size": 512}
    assert a["id"] == "a" and a["status"] == "created"
    assert a["name"] == "tiny adamw #1" and store.runs.get("c")["name"] == "tiny adamw #3"
    assert a["tags"] == [] and a["adapter"] is None and a["checkpoint_step"] is None
    assert set(a) == {"id", "created_at", "updated_at", "config", "status", "message",
                      "adapter", "checkpoint_step", "name", "tags", "notes", "last_step",
                      "last_loss", "first_time", "last_time", "last_eval_loss",
                      "best_eval_loss"}           # never the token's hash, nor the number
    assert a["last_step"] is None and a["best_eval_loss"] is None
    assert store.runs.get("b")["name"] == "my run"
    assert store.runs.get("nope") is None
    assert [r["id"] for r in store.runs.page()] == ["c", "b", "a"]      # newest first
    assert [r["id"] for r in store.runs.page(limit=2)] == ["c", "b"]


def test_a_run_carries_its_last_step_losses_and_times(store):
    store.runs.create("a", CFG, "h")
    store.metrics.add("a", [rec(1, 4.0, eval_loss=3.5), rec(2, 3.0, eval_loss=3.0),
                            rec(3, 2.5)])
    run = store.runs.get("a")
    assert run["last_step"] == 3 and run["last_loss"] == 2.5
    assert run["last_eval_loss"] == 3.0 and run["best_eval_loss"] == 3.0
    assert run["first_time"] == run["last_time"] and abs(run["last_time"] - time.time()) < 60
    assert store.runs.page()[0]["last_step"] == 3


def test_update_run_sets_name_tags_and_notes(store):
    store.runs.create("a", CFG, "h")
    assert store.runs.update("a", {"name": "renamed", "tags": ["x", "y"], "notes": "hi",
                                   "status": "ignored"})
    run = store.runs.get("a")
    assert (run["name"], run["tags"], run["notes"], run["status"]) == \
        ("renamed", ["x", "y"], "hi", "created")
    assert store.runs.update("a", {}) is True            # nothing to set: does it exist
    assert store.runs.update("nope", {}) is False
    assert store.runs.update("nope", {"name": "x"}) is False


def test_delete_run_removes_everything_it_had(store):
    store.runs.create("a", CFG, "h")
    store.runs.create("b", CFG, "h")
    store.metrics.add("a", [rec(1), rec(2)])
    store.events.add("a", 1, "sample", {"text": "hi"})
    store.runs.set_status("a", "running")
    store.runs.resume("a", 1, "h2", RESUMABLE)           # a revoked token
    assert store.runs.delete("a") is True
    assert store.runs.get("a") is None and store.metrics.all("a") == []
    assert store.events.all("a") == [] and store.runs.check_token("a", "anything") is None
    assert store.runs.delete("a") is False
    assert [r["id"] for r in store.runs.page()] == ["b"]
    store.runs.create("a", CFG, "h3")                    # the id is free again
    assert store.metrics.all("a") == [] and store.events.all("a") == []


def test_a_deleted_runs_number_is_never_given_again(store_backend):
    """Default names ("tiny adamw #3") count on from the highest number ever given: deleting
    the newest run, or every run, gave its number to the next one (two "#3"s in comparisons).
    The count is in the database: it survives a reopen."""
    store = store_backend.open()
    try:
        for run_id in ("a", "b", "c"):
            store.runs.create(run_id, CFG, "h")
        assert store.runs.delete("c")
        store.runs.create("d", CFG, "h")
        assert store.runs.get("d")["name"] == "tiny adamw #4"
        for run_id in ("a", "b", "d"):
            assert store.runs.delete(run_id)
        store.runs.create("e", CFG, "h", "named")            # a named run takes a number too
        store.runs.create("f", CFG, "h")
        assert store.runs.get("f")["name"] == "tiny adamw #6"
        assert store.runs.delete("f")
    finally:
        store.close()
    again = store_backend.open()
    try:
        again.runs.create("g", CFG, "h")
        assert again.runs.get("g")["name"] == "tiny adamw #7"
    finally:
        again.close()


def test_tokens_and_revoked_tokens(store):
    from andrea.write_tokens import token_hash
    store.runs.create("a", CFG, token_hash("first"))
    assert store.runs.check_token("a", "first") == "ok"
    assert store.runs.check_token("a", "other") == "wrong"
    assert store.runs.check_token("nope", "first") is None
    assert store.runs.get_with_token("a") == {"id": "a", "token_sha256": token_hash("first"),
                                              "status": "created"}
    assert store.runs.get_with_token("nope") is None
    store.runs.set_status("a", "stopped")
    assert store.runs.resume("a", 0, token_hash("second"), RESUMABLE) is None
    assert store.runs.check_token("a", "first") == "revoked"
    assert store.runs.check_token("a", "second") == "ok"
    store.runs.set_status("a", "stopped")
    assert store.runs.resume("a", 0, token_hash("third"), RESUMABLE) is None
    assert [store.runs.check_token("a", t) for t in ("first", "second", "third")] == \
        ["revoked", "revoked", "ok"]


def test_set_status_keeps_what_it_is_told_to_keep(store):
    store.runs.create("a", CFG, "h")
    assert store.runs.set_status("a", "running", adapter={"vendor": "x"}) == "running"
    assert store.runs.set_status("a", "stopped", "bye", keep=("running",)) == "running"
    run = store.runs.get("a")
    assert run["status"] == "running" and run["message"] is None
    assert run["adapter"] == {"vendor": "x"}
    assert store.runs.set_status("a", "running", keep=("running",)) == "running"    # the same
    assert store.runs.set_status("a", "failed", "boom") == "failed"
    assert store.runs.set_status("a", "interrupted") == "interrupted"   # message, adapter kept
    run = store.runs.get("a")
    assert (run["status"], run["message"], run["adapter"]) == \
        ("interrupted", "boom", {"vendor": "x"})


def test_set_status_only_from_the_statuses_it_is_given(store):
    """A watchdog that found a run running must not mark it interrupted once a resume made it
    `created` in between: the check and the write are one transaction."""
    store.runs.create("a", CFG, "h")
    store.runs.set_status("a", "running")
    assert store.runs.resume("a", 0, "h2", RESUMABLE) is None
    assert store.runs.set_status("a", "interrupted", "gone",
                                 only=("running", "paused")) == "created"
    assert store.runs.get("a")["status"] == "created"
    assert store.runs.set_status("a", "interrupted", "gone", only=("created",)) == "interrupted"
    assert store.runs.get("a")["message"] == "gone"
    assert store.runs.set_status("nope", "running") is None


def test_checkpoint_steps(store):
    store.runs.create("a", CFG, "h")
    store.runs.create("b", CFG, "h")
    assert store.runs.checkpoint_steps() == {}
    store.runs.set_checkpoint_step("a", 10)
    store.runs.set_checkpoint_step("b", 3_000_000_000)               # past 32 bits
    assert store.runs.checkpoint_steps() == {"a": 10, "b": 3_000_000_000}
    store.runs.set_checkpoint_step("a", None)
    assert store.runs.checkpoint_steps() == {"b": 3_000_000_000}
    assert store.runs.get("b")["checkpoint_step"] == 3_000_000_000


def test_abandon_stale(store):
    for run_id in "abcdef":
        store.runs.create(run_id, CFG, "h")
    store.metrics.add("b", [rec(1)])                    # recorded a step
    store.runs.set_checkpoint_step("c", 5)                   # has a checkpoint
    store.runs.set_status("d", "running")                    # not `created`
    later = time.time() + 1
    assert store.runs.abandon_stale(later, ("e",), "gone") == ["a", "f"]     # e is connected
    assert {r["id"]: r["status"] for r in store.runs.page()} == {
        "a": "abandoned", "b": "created", "c": "created", "d": "running", "e": "created",
        "f": "abandoned"}
    assert store.runs.get("a")["message"] == "gone"
    assert store.runs.abandon_stale(later, (), "gone") == ["e"]              # now nothing holds it
    assert store.runs.abandon_stale(0, (), "gone") == []                     # nothing that old


# ---- resume and branch -----------------------------------------------------------------------


def test_resume_run_cuts_the_run_back_to_its_checkpoint(store):
    store.runs.create("a", CFG, "h")
    store.metrics.add("a", [rec(s) for s in range(1, 11)])
    for s in (2, 5, 8):
        store.events.add("a", s, "sample", {"text": f"at {s}"})
    store.runs.set_status("a", "failed", "boom")
    assert store.runs.resume("nope", 5, "h2", RESUMABLE) == "unknown run 'nope'"
    assert store.runs.resume("a", 5, "h2", ("running",)) == "the run is failed"
    assert store.runs.get("a")["last_step"] == 10                    # nothing changed
    assert store.runs.resume("a", 5, "h2", RESUMABLE) is None
    run = store.runs.get("a")
    assert (run["status"], run["message"], run["checkpoint_step"], run["last_step"]) == \
        ("created", None, 5, 5)
    assert steps(store.metrics.all("a")) == [1, 2, 3, 4, 5]
    assert store.events.all("a") == [{"step": 2, "kind": "sample", "text": "at 2"},
                                     {"step": 5, "kind": "resumed"},
                                     {"step": 5, "kind": "sample", "text": "at 5"}]
    assert store.events.first_resume_after("a", 9) == 5
    assert store.events.first_resume_after("a", 5) is None
    # Steps after the checkpoint are free again: the resumed trainer's new records land.
    inserted, last = store.metrics.add("a", [rec(6, 1.0), rec(7, 1.0)])
    assert steps(inserted) == [6, 7] and last == 7
    store.runs.set_status("a", "stopped")
    assert store.runs.resume("a", 3, "h3", RESUMABLE) is None
    assert store.events.first_resume_after("a", 9) == 3


def test_a_resume_waits_for_the_lock_another_writer_holds(store, store_backend):
    store.runs.create("a", CFG, "h")
    store.runs.set_status("a", "stopped")
    done = []
    with store_backend.holding_the_lock("a"):
        t = threading.Thread(target=lambda: done.append(
            store.runs.resume("a", 0, "h2", RESUMABLE)))
        t.start()
        t.join(0.5)
        assert done == []                   # blocked behind the other transaction
    t.join(30)
    assert done == [None]


def test_two_concurrent_resumes_serialize_one_wins(store_backend):
    stores = [store_backend.open(), store_backend.open()]   # as two server processes
    try:
        stores[0].runs.create("a", CFG, "h")
        for round_ in range(5):
            stores[0].runs.set_status("a", "running")
            barrier, results = threading.Barrier(2), [None, None]

            def resume(i):
                barrier.wait()
                results[i] = stores[i].runs.resume("a", 0, f"h{round_}{i}", ("running",))
            threads = [threading.Thread(target=resume, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(results, key=str) == [None, "the run is created"], results
            winner = results.index(None)
            assert stores[0].runs.get_with_token("a")["token_sha256"] == f"h{round_}{winner}"
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("given,corpus_hash", [
    ({}, ""),
    ({"room": {"inner_steps": 5, "codec": "f16", "wait_for_slowest": False}}, "c0ffee"),
    ({"parent": {"run": "p", "step": 3}, "steps": 300, "optimizer": "adamw_8bit"}, "c0ffee"),
    ({"task": "reverse", "task_digits": 4, "eval_every": 0}, ""),
    ({"n_layer": 3, "n_embd": 72, "n_head": 3, "ffn_dim": 136, "seq_len": 80, "lr": 1e-3,
      "eps": 1e-6, "sources": ["docs", "stdlib"], "precision": "mixed", "f16_mirror": True,
      "clip_mode": "per_tensor", "checkpoint_every": 7, "data_mode": "bandit"}, "abc")])
def test_a_run_config_is_stored_as_before_and_reads_back_as_it_was(store, given, corpus_hash):
    """The row's JSON is what the store wrote when a config was a dict ({**RunConfig's
    model_dump(), "corpus_hash": ...}), byte for byte; it reads back as the same
    StoredRunConfig, field for field."""
    cfg = stored_config(corpus_hash, **given)
    store.runs.create("a", cfg, "h")
    with store.db.tx() as conn:
        raw = conn.execute(text("SELECT config FROM runs WHERE id = 'a'")).scalar()
    assert raw == json.dumps({**RunConfig(preset="tiny", **given).model_dump(),
                              "corpus_hash": corpus_hash})
    back = store.runs.get("a")["config"]
    assert type(back) is StoredRunConfig and back == cfg
    assert back.model_dump() == json.loads(raw)
    assert (back.room is None) == ("room" not in given)       # nested as their models
    assert back.room is None or back.room.codec == "f16"
    assert back.parent is None or (back.parent.run, back.parent.step) == ("p", 3)


def test_create_branch_copies_metrics_and_events_up_to_its_step(store):
    store.runs.create("p", CFG, "h")
    store.metrics.add("p", [rec(s, 10.0 - s, source_losses={"0": 1.0}) for s in range(1, 8)])
    store.events.add("p", 2, "phase", {"phase": 1})
    store.events.add("p", 4, "sample", {"text": "four"})
    store.events.add("p", 6, "sample", {"text": "six"})
    store.runs.set_status("p", "stopped")
    store.runs.resume("p", 7, "h2", RESUMABLE)                   # a `resumed` event at 7
    store.runs.create_branch("b", stored_config(lr=0.1), "hb", "p", 4)
    b = store.runs.get("b")
    assert (b["name"], b["config"].lr, b["checkpoint_step"], b["status"]) == \
        ("tiny adamw #2", 0.1, 4, "created")
    assert store.metrics.all("b") == store.metrics.all("p")[:4]
    assert store.events.all("b") == [{"step": 2, "kind": "phase", "phase": 1},
                                     {"step": 4, "kind": "resumed", "parent": "p"},
                                     {"step": 4, "kind": "sample", "text": "four"}]
    assert store.runs.check_token("b", "anything") == "wrong"
    # The two are independent from now on.
    assert steps(store.metrics.add("b", [rec(5, 0.5)])[0]) == [5]
    assert store.metrics.all("b")[-1]["loss"] == 0.5 and store.metrics.all("p")[4]["loss"] == 5.0
    store.runs.create_branch("c", CFG, "hc", "p", 0, "named")
    assert store.runs.get("c")["name"] == "named" and store.metrics.all("c") == []


# ---- metrics ---------------------------------------------------------------------------------


def test_add_metrics_first_write_wins(store):
    store.runs.create("a", CFG, "h")
    assert store.metrics.add("a", []) == ([], None)
    inserted, last = store.metrics.add("a", [rec(3, 3.0), rec(1, 1.0), rec(2, 2.0)])
    assert steps(inserted) == [1, 2, 3] and last == 3
    assert {r["time"] for r in inserted} == {inserted[0]["time"]}    # one commit, one time
    assert inserted[0] == {**rec(1, 1.0), "time": inserted[0]["time"]}
    # Resent steps are not inserted again (nor changed); new ones are, in step order.
    inserted, last = store.metrics.add("a", [rec(5, 5.0), rec(2, 99.0), rec(4, 4.0)])
    assert steps(inserted) == [4, 5] and last == 5
    assert [r["loss"] for r in store.metrics.all("a")] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert store.metrics.add("a", [rec(1, 7.0)]) == ([], 5)        # all known: nothing sent
    # A step twice in one batch: the first one.
    inserted, _ = store.metrics.add("a", [rec(6, 6.0), rec(6, 66.0)])
    assert [r["loss"] for r in inserted] == [6.0] and store.metrics.all("a", 5)[0]["loss"] == 6.0
    assert store.metrics.last_step("a") == 6 and store.metrics.last_step("nope") is None
    # The stored time is the one handed back (milliseconds).
    inserted, _ = store.metrics.add("a", [rec(7)])
    assert store.metrics.all("a", 6)[0]["time"] == inserted[0]["time"]
    assert inserted[0]["time"] == round(inserted[0]["time"], 3)


def test_grouped_commits_share_a_transaction_and_keep_each_callers_answer(store, monkeypatch):
    """Batches sent while a commit runs go in one transaction (group commit); each caller
    still gets its own inserted records and last step, and a batch that fails on its own
    does not fail the others (they are retried one by one)."""
    for run_id in "abc":
        store.runs.create(run_id, CFG, "h")
    transactions = []
    many = store.metrics.add_many
    monkeypatch.setattr(store.metrics, "add_many",
                        lambda batches: transactions.append(len(batches)) or many(batches))
    insert = store.metrics.insert

    def refuse_bad(db, run_id, records, now):
        if run_id == "bad":
            raise ValueError("a batch that cannot be stored")
        return insert(db, run_id, records, now)

    monkeypatch.setattr(store.metrics, "insert", refuse_bad)

    async def send():
        calls = [store.metrics.add_grouped(r, [rec(s) for s in range(1 + 10 * k, 11 + 10 * k)])
                 for k in range(5) for r in "abc"]
        calls.append(store.metrics.add_grouped("a", [rec(1, 99.0)]))    # a resend: nothing new
        calls.append(store.metrics.add_grouped("bad", [rec(1)]))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = aio.run(send())
    # All 17 in one transaction; it failed, so each again on its own.
    assert transactions == [17] + [1] * 17, transactions
    for k in range(5):
        for i, r in enumerate("abc"):
            inserted, last = results[3 * k + i]
            assert steps(inserted) == list(range(1 + 10 * k, 11 + 10 * k))
            assert last >= 10 * k + 10
    assert results[-2] == ([], 50)
    assert isinstance(results[-1], ValueError)
    for r in "abc":
        assert steps(store.metrics.all(r)) == list(range(1, 51))
    transactions.clear()                           # all well: one commit for all of them

    async def more():
        return await asyncio.gather(*(store.metrics.add_grouped(r, [rec(51)]) for r in "abc"))

    assert [steps(i) for i, _ in aio.run(more())] == [[51]] * 3 and transactions == [3]


def test_add_metrics_stores_none_and_non_finite_as_today(store):
    store.runs.create("a", CFG, "h")
    inserted, _ = store.metrics.add("a", [
        rec(1, None),                                           # not finite on the GPU
        rec(2, math.nan, eval_loss=math.nan, tokens_per_s=12.5),
        rec(3, 1.5, eval_loss=2.5, phase=3, opt_ms=0.25, step_ms=4.0,
            source_losses={"0": 1.25, "12": 2.0}),
    ])
    assert steps(inserted) == [1, 2, 3]
    got = store.metrics.all("a")
    t = got[0]["time"]
    # Required fields are always there (None: not finite), the others only when sent.
    assert got[0] == {"step": 1, "loss": None, "grad_norm": 1.0, "clip_scale": 1.0,
                      "lr": 1e-3, "time": t}
    assert got[1] == {"step": 2, "loss": None, "grad_norm": 1.0, "clip_scale": 1.0,
                      "lr": 1e-3, "tokens_per_s": 12.5, "time": t}
    assert got[2] == {"step": 3, "loss": 1.5, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
                      "step_ms": 4.0, "time": t, "eval_loss": 2.5, "phase": 3,
                      "opt_ms": 0.25, "source_losses": {"0": 1.25, "12": 2.0}}
    assert isinstance(got[2]["phase"], int) and isinstance(got[2]["lr"], float)
    text, last, n = store.metrics.page_json("a", None, 10)      # valid JSON: no NaN
    assert json.loads(text) == {"type": "records", "records": got} and (last, n) == (3, 3)


def test_floats_and_big_steps_round_trip_exactly(store):
    store.runs.create("a", CFG, "h")
    odd = [0.1 + 0.2, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.12345679,
           2.0 ** -20, -0.0, 1 / 3]
    store.metrics.add("a", [rec(i + 1, v) for i, v in enumerate(odd)]
                      + [rec(1_000_000_000, 1.0)])
    got = store.metrics.all("a")
    assert [r["loss"] for r in got[:-1]] == odd and got[-1]["step"] == 1_000_000_000


def test_a_whole_message_of_records_goes_in_one_batch(store):
    from andrea.telemetry import MAX_RECORDS
    store.runs.create("a", CFG, "h")
    batch = [rec(s, float(s), source_losses={"0": s / 7}) for s in range(1, MAX_RECORDS + 1)]
    inserted, last = store.metrics.add("a", batch)
    assert len(inserted) == MAX_RECORDS and last == MAX_RECORDS
    got = store.metrics.all("a")
    assert [r["loss"] for r in got] == [float(s) for s in range(1, MAX_RECORDS + 1)]
    assert got[99]["source_losses"] == {"0": 100 / 7}
    inserted, last = store.metrics.add("a", batch[-10:] + [rec(MAX_RECORDS + 1)])
    assert steps(inserted) == [MAX_RECORDS + 1] and last == MAX_RECORDS + 1


def test_metrics_pages_and_records_page_json(store):
    store.runs.create("a", CFG, "h")
    store.runs.create("b", CFG, "h")
    store.metrics.add("a", [rec(s) for s in range(1, 11)])
    store.metrics.add("b", [rec(s) for s in range(1, 4)])
    assert steps(store.metrics.page("a", None, 4)) == [1, 2, 3, 4]
    assert steps(store.metrics.page("a", 4, 4)) == [5, 6, 7, 8]
    assert steps(store.metrics.page("a", 8, 4)) == [9, 10]
    assert store.metrics.page("a", 10, 4) == []
    assert steps(store.metrics.page("a", 7, None)) == [8, 9, 10]
    assert steps(store.metrics.all("a")) == list(range(1, 11))
    assert steps(store.metrics.all("a", 9)) == [10]
    assert steps(store.metrics.all("b")) == [1, 2, 3]
    text, last, n = store.metrics.page_json("a", 2, 3)
    assert json.loads(text)["records"] == store.metrics.page("a", 2, 3) and (last, n) == (5, 3)
    assert store.metrics.page_json("a", 10, 3) == (None, 10, 0)
    assert store.metrics.page_json("nope", None, 3) == (None, None, 0)


# ---- the run summary (on the run's row) --------------------------------------------------------

SUMMARY = ("last_step", "last_loss", "first_time", "last_time", "last_eval_loss",
           "best_eval_loss")


def summary_of_records(store, run_id: str) -> dict:
    """What a run's summary must say: worked out from its records, as the list once did."""
    recs = store.metrics.all(run_id)
    if not recs:
        return dict.fromkeys(SUMMARY)
    evals = [r["eval_loss"] for r in recs if r.get("eval_loss") is not None]
    return {"last_step": recs[-1]["step"], "last_loss": recs[-1]["loss"],
            "first_time": recs[0].get("time"), "last_time": recs[-1].get("time"),
            "last_eval_loss": evals[-1] if evals else None,
            "best_eval_loss": min(evals) if evals else None}


def assert_summary(store, run_id: str, **expected) -> None:
    run = store.runs.get(run_id)
    got = {k: run[k] for k in SUMMARY}
    assert got == summary_of_records(store, run_id), run_id
    listed = next(r for r in store.runs.page(1000) if r["id"] == run_id)
    assert {k: listed[k] for k in SUMMARY} == got
    assert {k: got[k] for k in expected} == expected


def test_the_run_summary_follows_every_way_records_come_and_go(store):
    store.runs.create("a", CFG, "h")
    store.runs.create("b", CFG, "h")
    assert_summary(store, "a", last_step=None, best_eval_loss=None)
    store.metrics.add("a", [rec(7, 4.0), rec(5, 4.5), rec(6, 4.2, eval_loss=3.0), rec(8, 3.9)])
    assert_summary(store, "a", last_step=8, last_loss=3.9, last_eval_loss=3.0)
    time.sleep(0.01)        # (a later commit time)
    # Steps below the first (a gap filled late), a resend (ignored), a step whose loss is not
    # finite, an eval lower than the best at a step below the last eval's.
    store.metrics.add("a", [rec(2, 5.0), rec(6, 1.0, eval_loss=0.1), rec(9, math.nan),
                            rec(3, 4.8, eval_loss=2.0)])
    assert_summary(store, "a", last_step=9, last_loss=None, last_eval_loss=3.0,
                   best_eval_loss=2.0)
    at = {r["step"]: r["time"] for r in store.metrics.all("a")}
    assert store.runs.get("a")["first_time"] == at[2] > at[5]    # the lowest step's, later
    assert store.metrics.add("a", [rec(2), rec(9)]) == ([], 9)          # all resent
    assert_summary(store, "a", last_step=9)
    store.metrics.add("a", [rec(10, 3.5, eval_loss=2.5), rec(11, 3.4)])
    assert_summary(store, "a", last_step=11, last_eval_loss=2.5, best_eval_loss=2.0)

    async def grouped():      # the group commit: several batches, one transaction
        return await asyncio.gather(*(store.metrics.add_grouped(r, [rec(s, 1.0 / s)])
                                      for s in range(12, 20) for r in "ab"))
    aio.run(grouped())
    assert_summary(store, "a", last_step=19, last_eval_loss=2.5)
    assert_summary(store, "b", last_step=19, first_time=store.metrics.all("b")[0]["time"])
    # A resume deletes the records after its checkpoint: the summary goes back with them.
    store.runs.set_status("a", "stopped")
    store.runs.resume("a", 6, "h2", RESUMABLE)
    assert_summary(store, "a", last_step=6, last_loss=4.2, last_eval_loss=3.0,
                   best_eval_loss=2.0)
    store.metrics.add("a", [rec(7, 0.5)])
    assert_summary(store, "a", last_step=7, last_loss=0.5)
    store.runs.set_status("a", "stopped")
    store.runs.resume("a", 0, "h3", RESUMABLE)
    assert_summary(store, "a", last_step=None, first_time=None, best_eval_loss=None)
    store.metrics.add("a", [rec(1, 2.0)])
    assert_summary(store, "a", last_step=1, best_eval_loss=None)
    # A branch copies its parent's records up to its step, and its summary with them.
    store.metrics.add("b", [rec(20, 0.7, eval_loss=0.9), rec(21, 0.6, eval_loss=1.1)])
    store.runs.create_branch("c", CFG, "hc", "b", 20)
    assert_summary(store, "c", last_step=20, last_eval_loss=0.9, best_eval_loss=0.9)
    store.runs.create_branch("d", CFG, "hd", "b", 0)
    assert_summary(store, "d", last_step=None)
    assert_summary(store, "b", last_step=21, last_eval_loss=1.1, best_eval_loss=0.9)


def test_listing_and_reading_runs_reads_their_rows_alone(store):
    """One statement each, on the runs table only: what GET /api/runs costs does not depend on
    how many records the runs hold (tests/service/test_store_scale.py measures it)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    for run_id in "ab":
        store.runs.create(run_id, CFG, "h")
        store.metrics.add(run_id, [rec(s, eval_loss=1.0) for s in range(1, 50)])
    seen = []

    def statement(conn, cursor, sql, params, context, executemany):
        seen.append((sql, params))
    event.listen(Engine, "before_cursor_execute", statement)
    try:
        assert len(store.runs.page()) == 2 and len(seen) == 1
        assert store.runs.get("a")["last_step"] == 49 and len(seen) == 2
    finally:
        event.remove(Engine, "before_cursor_execute", statement)
    explain = "EXPLAIN " if store.db.postgres else "EXPLAIN QUERY PLAN "
    for sql, params in seen:
        assert "metrics" not in sql.lower(), sql
        with store.db.tx() as db:
            plan = " ".join(str(row) for row in db.exec_driver_sql(explain + sql, params))
        assert "runs" in plan and "metrics" not in plan, plan


# ---- events ----------------------------------------------------------------------------------


def test_events_and_their_pages(store):
    store.runs.create("a", CFG, "h")
    store.events.add("a", 3, "sample", {"text": "old"})
    store.events.add("a", 3, "sample", {"text": "three"})         # replaces
    store.events.add("a", 1, "sample", {"text": "one"})
    store.events.add("a", 3, "phase", {"phase": 2})
    store.events.add("a", 5, "sample", {"text": "five"})
    assert store.events.all("a") == [{"step": 1, "kind": "sample", "text": "one"},
                                     {"step": 3, "kind": "phase", "phase": 2},
                                     {"step": 3, "kind": "sample", "text": "three"},
                                     {"step": 5, "kind": "sample", "text": "five"}]
    assert steps(store.events.all("a", "sample")) == [1, 3, 5]
    assert store.events.all("a", "sample", 2) == [{"step": 3, "kind": "sample", "text": "three"},
                                                  {"step": 5, "kind": "sample", "text": "five"}]
    assert store.events.all("a", None, 2) == store.events.all("a")[-2:]
    assert store.events.all("a", "phase") == [{"step": 3, "kind": "phase", "phase": 2}]
    assert store.events.all("nope") == []
    assert store.events.page("a", (-1, ""), 2) == store.events.all("a")[:2]
    assert store.events.page("a", (3, "phase"), 10) == store.events.all("a")[2:]
    assert store.events.page("a", (3, "sample"), 10) == store.events.all("a")[3:]
    assert store.events.page("a", (5, "sample"), 10) == []
    assert store.events.first_resume_after("a", 10) is None


# ---- threads, opening, migration, outages ----------------------------------------------------


def test_run_off_the_event_loop_with_concurrent_writers(store):
    async def main():
        await store.run(store.runs.create, "a", CFG, "h")
        await store.run(store.runs.create, "b", CFG, "h")
        # Trainers writing at once, with readers in between.
        writes = [store.run(store.metrics.add, run_id, [rec(s)])
                  for s in range(1, 41) for run_id in "ab"]
        reads = [store.run(store.runs.get, "a") for _ in range(10)]
        results = await asyncio.gather(*writes, *reads)
        assert all(len(inserted) == 1 for inserted, _ in results[:80])
        return [await store.run(store.metrics.last_step, r) for r in "ab"]
    assert aio.run(main()) == [40, 40]
    store.close()                           # the threads end; the next call starts them again
    assert aio.run(store.run(store.metrics.page, "a", 38, None))[0]["step"] == 39


def test_open_picks_the_database(store_backend, tmp_path):
    store = store_backend.open()
    try:
        assert store.db.postgres == (store_backend.name == "postgresql")
        assert store_backend.path.exists() == (store_backend.name == "sqlite")
        store.runs.create("a", CFG, "h")
    finally:
        store.close()
    again = store_backend.open()                # reopening keeps the data
    try:
        assert again.runs.get("a")["name"] == "tiny adamw #1"
    finally:
        again.close()
    assert engine_url("postgresql://u:p@h:5/db").drivername == "postgresql+psycopg"
    assert engine_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    with pytest.raises(ValueError, match="postgresql://"):
        engine_url("mysql://u:secret@h/db")


# Today's SQLite schema, exactly as store.py created it before PostgreSQL came.
OLD_SQLITE_SCHEMA = """
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
# Older databases lacked these metrics columns (added when the new store opens them).
LATER = ("time", "opt_ms", "grad_nonfinite", "logit_max", "softmax_denom_min", "loss_scale",
         "eval_acc")
OLD_COLUMNS = {n: t for n, t in COLUMNS.items() if n not in LATER}


def _old_sqlite(path) -> None:
    """A file as the SQLite-only store made it (its ALTERs included), before `time` and
    `opt_ms` existed."""
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(OLD_SQLITE_SCHEMA)
    for name, sql_type in OLD_COLUMNS.items():
        if name != "step":
            conn.execute(f"ALTER TABLE metrics ADD COLUMN {name} {sql_type}")
    for i, run_id in enumerate(("r1", "r2", "r3")):
        conn.execute("INSERT INTO runs (id, created_at, updated_at, config, token_sha256,"
                     " status, name, tags) VALUES (?, ?, ?, ?, ?, 'stopped', ?, '[\"t\"]')",
                     (run_id, 1000.0 + i, 1000.0 + i, json.dumps(CFG.model_dump()),
                      "hash-" + run_id, f"tiny adamw #{i + 1}"))
    conn.execute("DELETE FROM runs WHERE id = 'r2'")            # rowids 1 and 3 are left
    cols = ", ".join(OLD_COLUMNS)
    conn.executemany(f"INSERT INTO metrics (run_id, {cols}, extra) VALUES"
                     f" ('r3', {', '.join('?' * len(OLD_COLUMNS))}, ?)",
                     [(s, 5.0 - s, 1.0, 1.0, 1e-3, 100.0, 12.0, None, None, '{"source_losses":'
                       ' {"0": 1.5}}' if s == 2 else None) for s in (1, 2)])
    conn.execute("INSERT INTO events VALUES ('r3', 2, 'sample', '{\"text\": \"hi\"}')")
    conn.execute("INSERT INTO revoked_tokens VALUES ('r3', ?)", (_hash("old-token"),))
    conn.close()


def _old_postgres(url: str) -> None:
    """A PostgreSQL database made before `time`, `opt_ms` (metrics) and `notes`, `number`
    (runs) existed."""
    cols = ", ".join(f"{n} {'bigint' if t == 'INTEGER' else 'double precision'}"
                     for n, t in OLD_COLUMNS.items() if n != "step")
    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE runs (id text PRIMARY KEY, created_at double precision NOT NULL,"
            " updated_at double precision NOT NULL, config text NOT NULL, token_sha256 text"
            " NOT NULL, status text NOT NULL, message text, adapter text, checkpoint_step"
            " bigint, name text, tags text)")
        conn.execute("CREATE TABLE metrics (run_id text NOT NULL REFERENCES runs(id), step"
                     f" bigint NOT NULL, extra text, {cols}, PRIMARY KEY (run_id, step))")
        conn.execute("CREATE TABLE events (run_id text NOT NULL REFERENCES runs(id), step"
                     " bigint NOT NULL, kind text NOT NULL, data text NOT NULL,"
                     " PRIMARY KEY (run_id, step, kind))")
        conn.execute("CREATE TABLE revoked_tokens (run_id text NOT NULL REFERENCES runs(id),"
                     " token_sha256 text NOT NULL, PRIMARY KEY (run_id, token_sha256))")
        for i, run_id in enumerate(("r1", "r3")):
            conn.execute("INSERT INTO runs VALUES (%s, %s, %s, %s, %s, 'stopped', NULL, NULL,"
                         " NULL, %s, '[\"t\"]')", (run_id, 1000.0 + i, 1000.0 + i,
                                                   json.dumps(CFG.model_dump()),
                                                   "hash-" + run_id, f"tiny adamw #{run_id[1]}"))
        names = ", ".join(OLD_COLUMNS)
        for s in (1, 2):
            conn.execute(f"INSERT INTO metrics (run_id, {names}, extra) VALUES ('r3',"
                         f" {', '.join(['%s'] * len(OLD_COLUMNS))}, %s)",
                         (s, 5.0 - s, 1.0, 1.0, 1e-3, 100.0, 12.0, None, None,
                          '{"source_losses": {"0": 1.5}}' if s == 2 else None))
        conn.execute("INSERT INTO events VALUES ('r3', 2, 'sample', '{\"text\": \"hi\"}')")
        conn.execute("INSERT INTO revoked_tokens VALUES ('r3', %s)", (_hash("old-token"),))


def _hash(token: str) -> str:
    from andrea.write_tokens import token_hash
    return token_hash(token)


def _old_database(store_backend) -> None:
    """The backend's database as an older release left it (see _old_sqlite, _old_postgres)."""
    if store_backend.name == "sqlite":
        _old_sqlite(store_backend.path)
    else:
        _old_postgres(store_backend.url)


def test_an_older_database_opens_keeps_its_data_and_gains_the_new_columns(store_backend):
    assert list(OLD_COLUMNS)[-2:] == ["eval_loss", "phase"]   # the order the rows above use
    _old_database(store_backend)
    store = store_backend.open()
    try:
        r3 = store.runs.get("r3")
        assert (r3["name"], r3["tags"], r3["status"], r3["last_step"], r3["last_loss"]) == \
            ("tiny adamw #3", ["t"], "stopped", 2, 3.0)
        assert r3["notes"] is None and r3["first_time"] is None      # no `time` back then
        assert store.metrics.all("r3") == [
            {"step": 1, "loss": 4.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
             "tokens_per_s": 100.0, "step_ms": 12.0},
            {"step": 2, "loss": 3.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3,
             "tokens_per_s": 100.0, "step_ms": 12.0, "source_losses": {"0": 1.5}}]
        assert store.events.all("r3") == [{"step": 2, "kind": "sample", "text": "hi"}]
        assert store.runs.check_token("r3", "old-token") == "revoked"
        assert [r["id"] for r in store.runs.page()] == ["r3", "r1"]
        # The new columns work, and numbering goes on after the old runs (SQLite: rowid 3).
        inserted, last = store.metrics.add("r3", [rec(3, 2.0, opt_ms=1.5)])
        assert last == 3 and store.metrics.all("r3", 2)[0]["opt_ms"] == 1.5
        assert store.metrics.all("r3", 2)[0]["time"] == inserted[0]["time"]
        assert store.runs.update("r3", {"notes": "kept"}) and store.runs.get("r3")["notes"] == \
            "kept"
        store.runs.create("new", CFG, "h")
        assert store.runs.get("new")["name"] == \
            ("tiny adamw #4" if store_backend.name == "sqlite" else "tiny adamw #3")
        assert store.runs.delete("new")          # and its number is not given again
        store.runs.create("newer", CFG, "h")
        assert store.runs.get("newer")["name"] == \
            ("tiny adamw #5" if store_backend.name == "sqlite" else "tiny adamw #4")
    finally:
        store.close()
    if store_backend.name == "postgresql":          # typed for PostgreSQL, not as SQLite's
        with psycopg.connect(store_backend.url) as conn:
            types = dict(conn.execute(
                "SELECT table_name || '.' || column_name, data_type FROM"
                " information_schema.columns WHERE column_name IN ('time', 'opt_ms', 'number',"
                " 'notes')").fetchall())
        assert types == {"metrics.time": "double precision",
                         "metrics.opt_ms": "double precision", "runs.number": "bigint",
                         "runs.notes": "text"}
    again = store_backend.open()                    # and opens again with nothing to add
    try:
        assert steps(again.metrics.all("r3")) == [1, 2, 3]
    finally:
        again.close()


def test_an_older_database_gets_its_run_summaries_once(store_backend):
    """The columns are added and filled from the records when the database opens, in that
    transaction; from then on the writers keep them (a second open computes nothing)."""
    _old_database(store_backend)
    store = store_backend.open()
    try:
        assert_summary(store, "r3", last_step=2, last_loss=3.0, first_time=None,
                       last_eval_loss=None)
        assert_summary(store, "r1", last_step=None)
        store.metrics.add("r3", [rec(3, 2.0, eval_loss=2.5)])
        assert_summary(store, "r3", last_step=3, last_eval_loss=2.5, best_eval_loss=2.5)
    finally:
        store.close()
    change = "UPDATE runs SET last_loss = 99 WHERE id = 'r3'"
    if store_backend.name == "sqlite":
        with sqlite3.connect(store_backend.path) as conn:
            conn.execute(change)
    else:
        with psycopg.connect(store_backend.url) as conn:
            conn.execute(change)
    again = store_backend.open()
    try:
        assert again.runs.get("r3")["last_loss"] == 99        # not computed again
    finally:
        again.close()

def test_a_database_out_of_reach_is_store_unavailable_then_recovers(store_backend, tmp_path):
    if store_backend.name == "sqlite":
        # SQLite: a database file that cannot be opened says which, and why.
        store_backend.path.mkdir(parents=True)              # a folder, not a file
        with pytest.raises(StoreUnavailable, match=str(store_backend.path)):
            store_backend.open()
        store_backend.path.rmdir()
        store = store_backend.open()
        store.close()
        return
    cluster = store_backend.cluster
    url = store_backend.url.replace("postgres@", "postgres:s3cret@")   # trust: any password
    store = Store.open(url, store_backend.path)
    try:
        store.runs.create("a", CFG, "h")
        cluster.stop()
        try:
            with pytest.raises(StoreUnavailable) as e:
                aio.run(store.run(store.runs.get, "a"))
            message = str(e.value)
            assert "s3cret" not in message and "postgres:***@127.0.0.1" in message, message
            assert f":{cluster.port}/" in message and "refused" in message, message
            with pytest.raises(StoreUnavailable, match="refused"):
                aio.run(store.run(store.metrics.add, "a", [rec(1)]))
            with pytest.raises(StoreUnavailable, match="refused"):
                Store.open(url, store_backend.path)
        finally:
            cluster.start()
        # The pool drops its dead connections and goes on.
        assert aio.run(store.run(store.metrics.add, "a", [rec(1)]))[1] == 1
        assert aio.run(store.run(store.runs.get, "a"))["last_step"] == 1
    finally:
        store.close()


def test_a_server_restart_under_open_connections_recovers(store_backend):
    """Connections in the pool die with the server (not refused: terminated); the next
    call after it is back works."""
    if store_backend.name == "sqlite":
        pytest.skip("PostgreSQL only: SQLite has no server")
    store = store_backend.open()
    try:
        async def busy():       # every pooled connection used once, then idle in the pool
            return await asyncio.gather(*(store.run(store.runs.page) for _ in range(8)))
        store.runs.create("a", CFG, "h")
        aio.run(busy())
        store_backend.cluster.stop()
        store_backend.cluster.start()
        assert len(aio.run(busy())) == 8
        assert store.runs.get("a")["id"] == "a"
    finally:
        store.close()
