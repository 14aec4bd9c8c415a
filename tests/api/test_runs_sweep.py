"""Branches a killed server left half-copied (runs/sweep.py drop_unfinished_branches): never
shown, not counted in X-Total-Count, removed at start; with a shared store, only those whose
copy stopped moving. Before, such a half-branch stayed hidden for ever."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import text

from andrea.cli.launch import start_server, stop_server
from andrea.paths import run_dir
from andrea.run_config import StoredRunConfig
from andrea.store import Store
from andrea.store.run_rows import BRANCH_PAGE
from tests.api.test_web_limits import new_run
from tests.trainer_client import stored_config

CFG = stored_config()


def rec(step: int) -> dict:
    return {"step": step, "loss": 5.0 - step * 1e-5, "grad_norm": 1.0, "clip_scale": 1.0,
            "lr": 1e-3}


# ---- a branch left half-copied by a killed server ------------------------------------------------


def test_a_branch_left_half_copied_by_a_killed_server_is_never_shown_and_removed_at_start(
        tmp_path):
    data, step = tmp_path / "data", 25_000
    proc, url = start_server(data)
    try:
        parent = new_run(url, steps=100_000)
        pid = parent["id"]
        config = httpx.get(f"{url}/api/runs/{pid}").json()["config"]
        store = Store(data / "andrea.sqlite")   # the server's own file, beside it
        try:
            for first in range(1, 30_001, 10_000):
                store.metrics.add(pid, [rec(s) for s in range(first, first + 10_000)])
            # Where POST /api/runs {parent} stands when its server is killed mid-copy: the
            # checkpoint linked, the branch's row made, a first page of records copied.
            branch = "halfbranch01"
            store.runs.begin_branch(branch, StoredRunConfig.model_validate(
                {**config, "parent": {"run": pid, "step": step}}), "h", pid, step)
            assert store.runs.copy_branch_page(branch, pid, step) == BRANCH_PAGE
        finally:
            store.close()
        ckpts = run_dir(data, branch) / "checkpoints"
        ckpts.mkdir(parents=True)
        for name in (f"{step:09d}.ckpt", f"{step:09d}.json"):
            (ckpts / name).write_bytes(b"linked from the parent")
        # Meanwhile (its copy under way, or its server gone): neither listed nor counted.
        r = httpx.get(url + "/api/runs")
        assert [x["id"] for x in r.json()] == [pid] and r.headers["x-total-count"] == "1"
        proc.kill()                             # kill -9: no shutdown, no cleanup
        proc.wait()
        proc, url = start_server(data)
        r = httpx.get(url + "/api/runs")
        assert [x["id"] for x in r.json()] == [pid] and r.headers["x-total-count"] == "1"
        assert httpx.get(f"{url}/api/runs/{branch}").status_code == 404
        assert not run_dir(data, branch).exists()
        assert "a branch left half-copied" in (data / "server.log").read_text()
    finally:
        stop_server(proc)
    store = Store(data / "andrea.sqlite")
    try:
        assert store.runs.get(branch) is None and store.runs.count() == 1
        assert store.metrics.all(branch) == [] and store.events.all(branch) == []
        assert len(store.metrics.all(pid)) == 30_000        # the parent untouched
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_with_a_shared_store_only_branches_whose_copy_stopped_are_taken_for_dead(
        request, tmp_path, backend):
    """Processes that share a store cannot tell a dead process' copy from a live one but by
    its progress: every page touches the branch's row; one that stopped moving is dropped, and
    a copy that was dropped so (it had stalled) ends with a reason, never a half branch."""
    store = (Store(tmp_path / "s.sqlite") if backend == "sqlite"
             else Store(url=request.getfixturevalue("pg_url")))
    try:
        store.runs.create("p", CFG, "hp")
        store.metrics.add("p", [rec(s) for s in range(1, 11)])
        store.runs.begin_branch("old", CFG, "h1", "p", 5)
        mark = store.runs.begin_branch("new", CFG, "h2", "p", 5)
        with store.db.tx(write=True) as db:      # both began long ago
            db.execute(text("UPDATE runs SET updated_at = updated_at - 1000"))
        assert store.runs.copy_branch_page("new", "p", 5) == 5       # it moves: touched
        assert store.runs.copy_branch_page("new", "p", 5) == 0       # (events: none; touched too)
        assert store.runs.unfinished_branches(time.time() - 300) == ["old"]
        assert store.runs.unfinished_branches() == ["new", "old"]
        assert store.runs.count() == 3 and store.runs.count(listed=True) == 1
        while store.runs.drop_branch_page("new"):    # taken for a dead one by another process
            pass
        why_not = store.runs.end_branch("new", "p", 5, mark)
        assert why_not and "branch it again" in why_not
        assert store.runs.get("new") is None and store.events.all("new") == []
    finally:
        store.close()
