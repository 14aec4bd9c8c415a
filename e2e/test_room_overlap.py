"""An overlapped room (its overlap on), in a real page: the page sends round 0 and trains
round 1 while the room still waits for another worker's round 0; version 1 arrives a few steps
into round 1 (its third batch held until then), and the page moves those steps onto it (the
math: tests/js/room_worker.test.mjs) and ends the room with every round sent. The other worker
is this test, through the API."""

from __future__ import annotations

import re
import time

import httpx
import numpy as np
import pytest

from tests.browser import PAGE_WAIT_MS
from tests.trainer_client import bearer, room_beside_the_api

TIMEOUT = 600_000
BATCH = re.compile(r"/room/batches/(\d+)/(\d+)/(\d+)")


@pytest.mark.parametrize("codec", ["f32", "int8"])   # int8: the move on the GPU (14_room_move)
def test_an_overlapped_page_trains_on_while_its_round_closes(browser, live_server, codec):
    H = 4
    made = room_beside_the_api(live_server, rounds=3, seed=17, overlap=True, codec=codec)
    run, room_url, api, delta = made["run"], made["url"], made["api"], made["delta"]
    page = browser.new_context().new_page()
    errors, asked, held = [], [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Each room batch the page asks for, as (version, step), with the room's version then.
    page.on("request", lambda r: (m := BATCH.search(r.url)) and asked.append(
        (int(m[1]), int(m[3]))))
    # Round 1's third batch waits until version 1 is made: the version comes mid-round.
    page.context.route("**/room/batches/1/*/2", lambda route: held.append(route))
    page.goto(f"{live_server}/runs/{run['id']}#join={run['room']['join_token']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.click("#join")
    hung = time.monotonic() + PAGE_WAIT_MS / 1000           # (a guard, not a deadline)

    def until(what, ok):
        while not ok():
            assert time.monotonic() < hung, what
            page.wait_for_timeout(100)

    # Round 0 sent (in the background: its report follows the upload), the page trains round 1
    # while the room waits for the API's round 0.
    until("round 1's third batch", lambda: held)
    room = httpx.get(room_url).json()
    page_worker = next(w["worker"] for w in room["workers"] if w["worker"] != api["worker"])

    def sent(version: int) -> bool:
        reports = httpx.get(f"{room_url}/reports").json()["reports"]
        return any(x["worker"] == page_worker and x["version"] == version for x in reports)

    until("the page's round 0", lambda: sent(0))
    assert httpx.get(room_url).json()["version"] == 0 and (1, 1) in asked, asked
    # The room says so, and the page's table shows it: ahead, training the next round.
    row = f"tr[data-worker='{page_worker}']"
    until("the page ahead", lambda: page.get_attribute(row, "data-state") == "ahead")
    assert "training the next round" in page.inner_text(row)
    r = httpx.post(f"{room_url}/deltas/0", content=delta, headers=bearer(api["token"]))
    assert r.status_code == 200 and r.json()["closed"], r.text
    until("version 1 downloaded", lambda: page.evaluate("window.andreaRoomWorker.arrived"))
    for route in held:
        route.continue_()

    # Round 1 (version 1 moved onto within it) and round 2 (the last: its end waits for
    # version 2 where it has not come), each sent by the page, then by the API.
    for v in (1, 2):
        until(f"the page's round {v}", lambda: sent(v))
        r = httpx.post(f"{room_url}/deltas/{v}", content=delta, headers=bearer(api["token"]))
        assert r.status_code == 200 and r.json()["closed"], r.text
    # Where each version arrived (the Trainer's steps done): version 1 inside round 1, version
    # 2 inside round 2 or at its end.
    moves = page.evaluate("window.andreaRoomWorker.moves")
    page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("main")
    assert [m["version"] for m in moves] == [1, 2], moves
    assert H < moves[0]["step"] < 2 * H and 2 * H < moves[1]["step"] <= 3 * H, moves
    room = httpx.get(room_url).json()
    assert room["finished"] and room["version"] == 3
    for line in room["closed"]:                    # every round closed on both workers
        assert {int(w) for w in line["workers"]} == {page_worker, api["worker"]}, line
    reports = httpx.get(f"{room_url}/reports").json()["reports"]
    mine = {x["version"]: x for x in reports if x["worker"] == page_worker}
    assert [len(mine[v]["losses"]) for v in (0, 1, 2, 3)] == [H, H, H, 0]
    assert all(np.isfinite(mine[v]["eval_loss"]) for v in mine)
    assert not errors, errors
