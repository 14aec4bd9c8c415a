"""A room a newcomer can use: the join link says what joining means before anything is joined
and joins with one click; the room's page says what each worker does now and what the open
round waits for, and a worker that left may come back; the runs list and /compare read a room
run in rounds, workers and tokens (the suite's small model, tests/small_model.py, on
SwiftShader for the one page that trains; the others read a room made through the API)."""

from __future__ import annotations

import json
import re
import time

import httpx
import numpy as np

from e2e.room_api import a_room
from tests.browser import PAGE_WAIT_MS
from tests.small_model import SMALL
from tests.trainer_client import bearer, hello, record, ws_url

TIMEOUT = 600_000


def test_a_newcomer_joins_in_one_click_sees_the_round_wait_and_comes_back(browser, live_server):
    """One page trains (worker 1) beside worker 0, a worker through the API that tells its step
    and sends nothing: the page says the round waits for it, then the page leaves (at once,
    though the round waits), worker 0 leaves too, and the page rejoins as worker 1 and trains
    the room to its end."""
    H, ROUNDS = 3, 2
    run = httpx.post(f"{live_server}/api/runs", json={
        **SMALL, "steps": H * ROUNDS, "batch_size": 2, "seed": 11, "warmup_steps": 0,
        "room": {"inner_steps": H, "codec": "f16", "round_deadline_s": 900,
                 "workers_per_address": 2}}).json()
    room_url = f"{live_server}/api/runs/{run['id']}/room"
    join = bearer(run["room"]["join_token"])
    slow = httpx.post(f"{room_url}/workers", headers=join).json()
    assert httpx.post(f"{room_url}/progress/0", json={"step": 2},
                      headers=bearer(slow["token"])).status_code == 204
    page = browser.new_context().new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{live_server}/runs/{run['id']}#join={run['room']['join_token']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    # Before joining: what it means, and one button.
    offer = " ".join(page.inner_text("#join-offer").split())
    n_params = httpx.get(f"{live_server}/api/runs/{run['id']}").json()["n_params"]
    for words in ("this tab's GPU", f"{H} inner steps", f"{ROUNDS} rounds", "tiny",
                  f"{n_params / 1e3:.1f} k parameters"):
        assert words in offer, (words, offer)
    assert page.inner_text("#join") == "Join and train"
    assert [b for b in page.locator("button:visible").all_inner_texts()
            if "join" in b.lower() and "copy" not in b.lower()] == ["Join and train"]
    assert len(httpx.get(room_url).json()["workers"]) == 1     # opening it joined nothing
    page.click("#join")
    # It trains its round and sends: the round waits for worker 0, at its step 2 of 3.
    mine = "#workers tr[data-worker='1']"
    page.wait_for_function(f"document.querySelector(\"{mine}\")?.dataset.state === 'waiting'",
                           timeout=TIMEOUT)
    assert not page.is_visible("#join-offer")
    assert re.search(r"waiting for 1 of 2 workers, closes in 1[0-5]:\d\d",
                     page.inner_text("#round-status")), page.inner_text("#round-status")
    assert "training (step 2 of 3)" in page.inner_text("#workers tr[data-worker='0']")
    assert "waiting for the round to close (this tab)" in page.inner_text(mine)
    # It leaves at once, though the round still waits (its pseudo-gradient leaves the round with
    # it), and worker 0 leaves too.
    page.click("#leave")
    assert httpx.delete(f"{room_url}/workers", headers=bearer(slow["token"])).status_code == 204
    page.wait_for_function("document.body.dataset.done === 'stopped'", timeout=TIMEOUT)
    page.wait_for_function("document.querySelector(\"#workers tr[data-worker='0']\")"
                           "?.dataset.state === 'left'", timeout=PAGE_WAIT_MS)
    assert page.locator(f"{mine} td").nth(1).inner_text() == "left"
    # It may come back, as itself.
    assert page.is_visible("#join-offer") and page.inner_text("#join") == "Rejoin as worker 1"
    page.click("#join")
    page.wait_for_function("document.body.dataset.done === 'finished'", timeout=TIMEOUT)
    room = httpx.get(room_url).json()
    assert room["finished"] and len(room["workers"]) == 2
    assert room["workers"][1]["left"] is None and room["workers"][0]["left"] is not None
    # Every round closed on the rejoined page's pseudo-gradient (round 0's again: the first one
    # left the round with it).
    assert [list(c["workers"]) for c in room["closed"]] == [["1"]] * ROUNDS
    assert page.inner_text("[data-stat='workers']").endswith("none training: finished (2 joined)")
    assert not errors, errors
    assert not page.is_visible("#error"), page.inner_text("#error")


def test_a_closed_tab_leaves_and_its_round_closes_on_the_others(browser, live_server):
    """Worker 0 (the API) has sent; the page's worker is mid-round (its batches held) when its
    tab goes: the page leaves as it goes, and the round closes on worker 0's at once, not a
    round deadline (here an hour) later."""
    from andrea.room.rounds import param_mask

    H = 3
    run = httpx.post(f"{live_server}/api/runs", json={
        **SMALL, "steps": 2 * H, "batch_size": 2, "seed": 12,
        "room": {"inner_steps": H, "codec": "f32", "round_deadline_s": 3600,
                 "workers_per_address": 2}}).json()
    room_url = f"{live_server}/api/runs/{run['id']}/room"
    first = httpx.post(f"{room_url}/workers", headers=bearer(run["room"]["join_token"])).json()
    page = browser.new_context().new_page()
    held = []
    page.context.route("**/room/batches/0/*/1", lambda route: held.append(route))
    page.goto(f"{live_server}/runs/{run['id']}#join={run['room']['join_token']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.click("#join")
    page.wait_for_function("document.body.dataset.workerStatus === 'running'",
                           timeout=TIMEOUT)
    while not held:                                   # mid-round: its second batch is held
        page.wait_for_timeout(200)
    delta = (np.full(run["layout"]["total_numel"], 1e-4, np.float32)
             * param_mask(run["layout"]))
    r = httpx.post(f"{room_url}/deltas/0", content=delta.tobytes(),
                   headers=bearer(first["token"]))
    assert r.json() == {"closed": False, "version": 0}      # it waits for the page's
    page.goto("about:blank")                                # the tab goes
    hung = time.monotonic() + PAGE_WAIT_MS / 1000            # (a guard: the deadline is 3600 s)
    while (room := httpx.get(room_url).json())["version"] == 0 and time.monotonic() < hung:
        page.wait_for_timeout(200)
    assert room["version"] == 1, room
    assert list(room["closed"][-1]["workers"]) == [str(first["worker"])]
    page_worker = next(w for w in room["workers"] if w["worker"] != first["worker"])
    assert page_worker["left"] is not None and page_worker["why"] == "left"
    page.close()


def a_finished_room(url: str) -> tuple[dict, dict]:
    """e2e/room_api.py's room of two API workers over 2 rounds, no inner losses. -> (the run,
    its room)."""
    run = a_room(url, inner=False)
    room = httpx.get(f"{url}/api/runs/{run['id']}/room").json()
    assert room["finished"] and room["version"] == 2
    return run, room


def test_the_runs_list_and_compare_read_a_room_in_rounds_workers_and_tokens(page, live_server):
    from websockets.sync.client import connect

    room_run, _ = a_finished_room(live_server)
    plain = httpx.post(f"{live_server}/api/runs", json={
        **SMALL, "steps": 4, "batch_size": 2, "seed": 4}).json()
    with connect(ws_url(live_server, f"/ws/runs/{plain['id']}")) as ws:
        assert hello(ws, plain["token"])["type"] == "welcome"
        recs = [{**record(s), **({"eval_loss": 4.4} if s in (2, 4) else {})} for s in range(1, 5)]
        ws.send(json.dumps({"type": "metrics", "records": recs}))
        assert json.loads(ws.recv(timeout=10))["type"] == "ack"
    # /runs: the room in rounds, its last global eval loss, its workers now.
    page.goto(f"{live_server}/runs")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    row = page.locator(f"#runs tr[data-run-id='{room_run['id']}']")
    assert row.locator("td.progress").inner_text() == "2 / 2 rounds (100 %)"
    assert row.locator("td.status").inner_text() == "finished · 2 workers trained it"
    assert row.locator("td.last-loss").inner_text() == "4.1000"     # version 2's median
    assert row.locator("td.best-eval").inner_text() == "4.1000"
    assert page.locator(f"#runs tr[data-run-id='{plain['id']}'] td.progress").inner_text() \
        == "4 / 4 (100 %)"
    # /compare, the room first: one tokens axis, a one-browser baseline, room settings as rows.
    page.goto(f"{live_server}/compare?ids={room_run['id']},{plain['id']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    assert page.get_attribute("#charts", "data-x") == "tokens"
    assert page.input_value("#baseline") == plain["id"]
    # Tokens: the plain run's steps 1-4 at 2 x 32 tokens each (64 .. 256); the room's versions
    # at 0, 2 workers x 2 inner steps x 64 = 256, and 512.
    assert page.evaluate("window.andreaCharts.eval.plot.data[0]") == [0, 64, 128, 192, 256, 512]
    evals = [[None if x is None else round(x, 6) for x in col] for col in
             page.evaluate("window.andreaCharts.eval.plot.data.slice(1)")]
    assert evals[0] == [5.1, None, None, None, 4.7, 4.1]                 # the room's medians
    assert evals[1] == [None, None, 4.4, None, 4.4, None]
    labels = " ".join(page.locator("#baseline option").all_inner_texts())
    assert "x its tokens" not in labels and "its workers' tokens together" in labels
    assert "tokens" in page.inner_text("[data-chart='eval loss']")
    key = page.locator("#config-diff tr[data-key='room: inner_steps'] td")
    assert key.all_inner_texts() == ["room: inner_steps", "2", "–"]
    assert page.locator("#config-diff tr[data-key='room run'] td").all_inner_texts() == \
        ["room run", "yes", "no"]
    assert not any(t.startswith("{") for t in page.locator("#config-diff td").all_inner_texts())
