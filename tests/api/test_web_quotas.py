"""Quotas with clear answers (server/web/quotas.py), each against a real server with small limits
(ANDREA_* settings): new runs per client (429 + Retry-After) and in all (507), the data dir's
free-space floor (507 for a new run, a checkpoint and the weights, nothing written), samples per
run (dropped past the quota, the trainer told once, training goes on), the metrics rate (the
socket is read more slowly, nothing lost), the runs list in pages (Link headers), and a branch
that copies its parent's records in pages while other trainers' commits go on."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import httpx
import pytest
from websockets.sync.client import connect

from andrea.store import Store
from tests import aio, trainer_client
from tests.trainer_client import bearer, hello, record, stored_config, stored_steps, ws_url

# ---- helpers ---------------------------------------------------------------------------------


def post_run(url: str, **cfg) -> httpx.Response:
    return httpx.post(url + "/api/runs", json={"preset": "tiny", "steps": 100, **cfg},
                      timeout=120)


def new_run(url: str, **cfg) -> dict:
    return trainer_client.new_run(url, **{"steps": 100, **cfg})     # post_run's


def listed(url: str) -> list[str]:
    return [r["id"] for r in httpx.get(url + "/api/runs?limit=500").json()]


def until_pong(ws) -> list[dict]:
    """Pings, then reads up to the pong: every message the server sent before it."""
    ws.send(json.dumps({"type": "ping"}))
    got = []
    while (msg := json.loads(ws.recv(timeout=15)))["type"] != "pong":
        got.append(msg)
    return got


def sample_steps(url: str, run_id: str) -> list[int]:
    return [s["step"] for s in httpx.get(f"{url}/api/runs/{run_id}").json()["samples"]]


# ---- (1) new runs per client: 429 with Retry-After -------------------------------------------


def test_new_runs_past_the_burst_get_429_with_retry_after(servers):
    """Before: runs could be created at ~120/s with no cap."""
    url = servers(run_burst=3, run_rate_per_s=1).url
    made, refused = [], None
    for _ in range(10):     # the burst, then one a second: a refusal comes within a few
        r = post_run(url)
        if r.status_code != 201:
            refused = r
            break
        made.append(r.json()["id"])
    assert refused is not None and len(made) >= 3
    assert refused.status_code == 429, refused.text
    retry = int(refused.headers["retry-after"])
    assert 1 <= retry <= 2
    detail = refused.json()["detail"]
    assert "too many new runs" in detail and f"try again in {retry} s" in detail
    assert sorted(listed(url)) == sorted(made)      # the refused one stored nothing
    time.sleep(retry)
    assert post_run(url).status_code == 201         # after Retry-After: accepted again
    assert len(listed(url)) == len(made) + 1


# ---- (2) runs in all: 507 ---------------------------------------------------------------------


def test_runs_past_max_runs_get_507_until_some_are_deleted(servers):
    url = servers(max_runs=2).url
    runs = [new_run(url), new_run(url)]
    r = post_run(url)
    assert r.status_code == 507, r.text
    assert "holds 2 runs" in r.json()["detail"] and "delete runs" in r.json()["detail"]
    assert sorted(listed(url)) == sorted(run["id"] for run in runs)
    gone = httpx.delete(f"{url}/api/runs/{runs[0]['id']}",
                        headers=bearer(runs[0]["token"]))
    assert gone.status_code == 204, gone.text
    assert post_run(url).status_code == 201


# ---- (3) the data dir's free-space floor: 507, nothing written -------------------------------


def test_below_the_disk_floor_new_runs_and_uploads_get_507_and_nothing_is_written(
        servers, tmp_path):
    data = tmp_path / "floor"
    earlier = servers(data)
    run = new_run(earlier.url)
    earlier.stop()
    url = servers(data, min_free_bytes=1 << 60).url   # more than any disk has free
    auth = bearer(run["token"])
    files_before = sorted(p.relative_to(data) for p in data.rglob("*")
                          if p.name != "server.log" and "andrea.sqlite" not in p.name)

    r = post_run(url)
    assert r.status_code == 507, r.text
    assert "not enough disk space for a new run" in r.json()["detail"]
    assert "ANDREA_MIN_FREE_BYTES" in r.json()["detail"]

    weights = 4 * run["layout"]["total_numel"]
    r = httpx.put(f"{url}/api/runs/{run['id']}/weights", content=b"\0" * weights,
                  headers=auth, timeout=60)
    assert r.status_code == 507, r.text
    assert "not enough disk space for the weights" in r.json()["detail"]

    ckpt = sum(s["bytes"] for s in run["checkpoint"]["sections"])
    r = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=b"\0" * ckpt,
                  headers=auth, timeout=60)
    assert r.status_code == 507, r.text
    assert "not enough disk space for checkpoint 1" in r.json()["detail"]

    assert listed(url) == [run["id"]]
    assert httpx.get(f"{url}/api/runs/{run['id']}/checkpoints").json() == []
    assert not httpx.get(f"{url}/api/runs/{run['id']}").json()["has_weights"]
    files_after = sorted(p.relative_to(data) for p in data.rglob("*")
                         if p.name != "server.log" and "andrea.sqlite" not in p.name)
    assert files_after == files_before      # no .part, no checkpoint, no folder


# ---- (4) samples per run ------------------------------------------------------------------


def test_samples_past_the_quota_are_dropped_the_trainer_told_once_training_goes_on(servers):
    """Before: one socket with its own token stored samples at ~37 MB/s."""
    url = servers(max_samples_per_run=3, max_sample_bytes_per_run=1024).url
    by_count, by_bytes = new_run(url), new_run(url)
    with connect(ws_url(url, f"/ws/runs/{by_count['id']}")) as ws:
        assert hello(ws, by_count["token"])["type"] == "welcome"
        for step in range(1, 6):
            ws.send(json.dumps({"type": "sample", "step": step, "text": f"text {step}"}))
        notices = until_pong(ws)
        assert [m["type"] for m in notices] == ["notice"]       # one, and no close
        assert "quota is 3 samples" in notices[0]["message"]
        ws.send(json.dumps({"type": "metrics", "records": [record(s) for s in range(1, 11)]}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "ack", "step": 10}
    assert sample_steps(url, by_count["id"]) == [1, 2, 3]
    assert stored_steps(url, by_count["id"]) == list(range(1, 11))
    # A new socket counts from what is stored: still over, told again once.
    with connect(ws_url(url, f"/ws/runs/{by_count['id']}")) as ws:
        assert hello(ws, by_count["token"], 10)["type"] == "welcome"
        ws.send(json.dumps({"type": "sample", "step": 11, "text": "more"}))
        ws.send(json.dumps({"type": "sample", "step": 12, "text": "more"}))
        assert [m["type"] for m in until_pong(ws)] == ["notice"]
    assert sample_steps(url, by_count["id"]) == [1, 2, 3]

    # 412 bytes each as stored: two fit in 1024, the third would not.
    with connect(ws_url(url, f"/ws/runs/{by_bytes['id']}")) as ws:
        assert hello(ws, by_bytes["token"])["type"] == "welcome"
        for step in range(1, 5):
            ws.send(json.dumps({"type": "sample", "step": step, "text": "x" * 400}))
        assert [m["type"] for m in until_pong(ws)] == ["notice"]
        ws.send(json.dumps({"type": "metrics", "records": [record(1)]}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "ack", "step": 1}
    assert sample_steps(url, by_bytes["id"]) == [1, 2]


# ---- (5) the metrics rate: backpressure, nothing lost -----------------------------------------


def test_records_far_above_the_metrics_rate_are_all_committed(servers):
    url = servers(metrics_rate_per_s=500).url         # a burst of 1000, then 500/s
    run = new_run(url, steps=3000)
    with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
        assert hello(ws, run["token"])["type"] == "welcome"
        for first in range(1, 3001, 500):           # all of it at once, no ack awaited
            ws.send(json.dumps({"type": "metrics", "records": [
                record(s) for s in range(first, first + 500)]}))
        acks = [json.loads(ws.recv(timeout=60)) for _ in range(6)]
    assert acks == [{"type": "ack", "step": s} for s in range(500, 3001, 500)]
    assert stored_steps(url, run["id"]) == list(range(1, 3001))


# ---- (6) the runs list in pages ------------------------------------------------------------


def test_the_runs_list_pages_through_every_run_newest_first(servers):
    """Before: the list had no paging (GET /api/runs showed the newest 200)."""
    url = servers().url
    made = [new_run(url)["id"] for _ in range(7)]
    seen, pages, next_url = [], [], url + "/api/runs?limit=3"
    while next_url:
        r = httpx.get(next_url)
        assert r.status_code == 200, r.text
        assert r.headers["x-total-count"] == "7"
        pages.append(len(r.json()))
        seen += [run["id"] for run in r.json()]
        link = r.links.get("next")
        next_url = link and url + link["url"]
    assert seen == made[::-1] and pages == [3, 3, 1]
    assert [r["id"] for r in httpx.get(url + "/api/runs").json()] == made[::-1]  # limit 100
    bad = httpx.get(url + "/api/runs?before=yesterday")
    assert bad.status_code == 400 and "Link header" in bad.json()["detail"]
    assert httpx.get(url + "/api/runs?limit=501").status_code == 422


# ---- (7) a branch copies in pages, other commits go on ----------------------------------------

CFG = stored_config()
PARENT, K = 100_000, 60_000


def _store_rec(step: int) -> dict:
    """An eval every 1000 steps, best at 30,000: the summary's best and last evals differ."""
    return {"step": step, "loss": 5.0 - step / PARENT, "grad_norm": 1.0, "clip_scale": 1.0,
            "lr": 1e-3, **({"eval_loss": 1.0 + abs(step - 30_000) / 1000}
                           if step % 1000 == 0 else {})}


@pytest.fixture(params=["sqlite", "postgresql"])
def big_store(request, tmp_path):
    store = (Store(tmp_path / "s.sqlite") if request.param == "sqlite"
             else Store(url=request.getfixturevalue("pg_url")))
    store.runs.create("p", CFG, "hp")
    store.runs.create("other", CFG, "ho")
    for first in range(1, PARENT + 1, 10_000):
        store.metrics.add("p", [_store_rec(s) for s in range(first, first + 10_000)])
    for step in (10, K, K + 1):
        store.events.add("p", step, "sample", {"text": f"at {step}"})
    yield store
    store.close()


def test_a_branch_copies_up_to_its_step_in_pages_while_other_commits_go_on(big_store):
    """Before: the copy of a 1M-record run was one write transaction (~2 s) and every
    trainer's commit waited behind it."""
    store = big_store

    async def branch_while_committing() -> tuple[str | None, int, int]:
        made = asyncio.create_task(store.runs.branch("b", CFG, "hb", "p", K))
        commits = partway = 0
        def commit_and_look(step: int) -> bool:
            """Another run's commit, then whether the branch had some of its rows and not yet
            its last one: one call on the writer's threads, between the copy's pages (looked
            at from a reader thread, a loaded machine let the copy end before the look)."""
            store.metrics.add("other", [_store_rec(step)])
            return (bool(store.metrics.page("b", None, 1))
                    and not store.metrics.page("b", K - 1, 1))

        while not made.done():
            partway += await store.run(commit_and_look, commits + 1)
            commits += 1
        return await made, commits, partway

    why_not, commits, partway = aio.run(branch_while_committing())
    assert why_not is None
    assert partway >= 1, "no commit of another run completed while the copy was partway"
    assert [r["step"] for r in store.metrics.all("other")] == list(range(1, commits + 1))
    copied = store.metrics.all("b")
    assert len(copied) == K and copied[0]["step"] == 1 and copied[-1]["step"] == K
    assert [(e["step"], e["kind"]) for e in store.events.all("b")] == [
        (10, "sample"), (K, "resumed"), (K, "sample")]
    b = store.runs.get("b")
    assert (b["last_step"], b["checkpoint_step"]) == (K, K)
    # Its summary (built page by page) is that of the parent's records up to K.
    kept = [r for r in store.metrics.all("p") if r["step"] <= K]
    evals = [r["eval_loss"] for r in kept if r.get("eval_loss") is not None]
    assert (evals[-1], min(evals)) == (31.0, 1.0)
    assert (b["last_loss"], b["first_time"], b["last_time"], b["last_eval_loss"],
            b["best_eval_loss"]) == (kept[-1]["loss"], kept[0]["time"], kept[-1]["time"],
                                     31.0, 1.0)
    assert "b" in [r["id"] for r in store.runs.page()]


def test_a_branch_whose_parent_is_resumed_meanwhile_is_refused_and_removed(big_store):
    store = big_store
    mark = store.runs.begin_branch("b", CFG, "hb", "p", K)
    assert "b" not in [r["id"] for r in store.runs.page()]     # not listed while being made
    assert store.runs.copy_branch_page("b", "p", K) == 20_000
    store.runs.set_status("p", "stopped")
    assert store.runs.resume("p", K - 5_000, "hp2", ("stopped",)) is None
    while store.runs.copy_branch_page("b", "p", K):
        pass
    why_not = store.runs.end_branch("b", "p", K, mark)
    assert why_not and "was resumed while the branch copied" in why_not
    while store.runs.drop_branch_page("b"):
        pass
    assert store.runs.get("b") is None
    assert store.metrics.all("b") == [] and store.events.all("b") == []
    assert store.runs.count() == 2


def test_an_older_database_gains_the_runs_list_index(tmp_path):
    path = tmp_path / "old.sqlite"
    Store(path).close()
    with sqlite3.connect(path) as db:       # as a database from before the index was
        db.execute("DROP INDEX runs_by_created")
    Store(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE type = 'index'"
                          " AND name = 'runs_by_created'").fetchall() == [("runs_by_created",)]
