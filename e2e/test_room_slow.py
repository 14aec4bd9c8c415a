"""A room that does not wait for its slowest worker (wait_for_slowest off), in a real page: a
worker through the API sends a whole round while the page's worker is one step into it (its
next batch held, as a slow laptop would be); the room cuts the round, the page hears it over
its websocket, ends its round after the step in flight and sends the pseudo-gradient of the
two steps it took, and the close weights each by its steps (the math: tests/api/test_room.py)."""

from __future__ import annotations

import time

import httpx

from tests.browser import PAGE_WAIT_MS
from tests.trainer_client import bearer, room_beside_the_api

TIMEOUT = 600_000


def test_a_slow_page_sends_what_it_trained_when_the_room_cuts_its_round(browser, live_server):
    H = 4
    made = room_beside_the_api(live_server, rounds=2, seed=13, wait_for_slowest=False)
    run, room_url, fast, delta = made["run"], made["url"], made["api"], made["delta"]
    page = browser.new_context().new_page()
    errors, held = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    frames = []                                     # what the page's websocket hears
    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
    # The page's worker trains version 0's first step, then waits for its second batch.
    page.context.route("**/room/batches/0/*/1", lambda route: held.append(route))
    page.goto(f"{live_server}/runs/{run['id']}#join={run['room']['join_token']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.click("#join")
    hung = time.monotonic() + PAGE_WAIT_MS / 1000           # (a guard, not a deadline)
    while not held:
        assert time.monotonic() < hung, "the page never asked for its second batch"
        page.wait_for_timeout(200)
    r = httpx.post(f"{room_url}/deltas/0", content=delta,
                   headers=bearer(fast["token"]))
    assert r.json() == {"closed": False, "version": 0}       # 1 of 2 whole: the round is cut
    assert httpx.get(room_url).json()["open"]["cut"]
    while not any('"cut"' in f for f in frames):            # the page hears of the cut
        assert time.monotonic() < hung, frames[-5:]
        page.wait_for_timeout(100)
    for route in held:
        route.continue_()
    while (room := httpx.get(room_url).json())["version"] == 0:
        assert time.monotonic() < hung, room
        page.wait_for_timeout(200)
    line = room["closed"][-1]
    mine = str(fast["worker"])
    steps = {w: v["steps"] for w, v in line["workers"].items()}
    assert steps[mine] == H
    (other,) = set(steps) - {mine}
    assert steps[other] == 2, steps                          # the step held, then the cut
    assert line["cut_at"] is not None
    # Version 1: the page trains a whole round (nobody cut it); the API worker sends after it.
    def page_sent(room: dict) -> bool:
        return any(w["worker"] == int(other) and w["state"] == "waiting"
                   for w in room["workers"])
    while not page_sent(room := httpx.get(room_url).json()):
        assert time.monotonic() < hung, room
        page.wait_for_timeout(200)
    r = httpx.post(f"{room_url}/deltas/1", content=delta,
                   headers=bearer(fast["token"]))
    assert r.status_code == 200 and r.json()["closed"], r.text
    page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("main")
    room = httpx.get(room_url).json()
    assert room["finished"]
    assert {w: v["steps"] for w, v in room["closed"][-1]["workers"].items()} == \
        {mine: H, other: H}
    reports = httpx.get(f"{room_url}/reports").json()["reports"]
    losses = {r["version"]: len(r["losses"]) for r in reports if r["worker"] == int(other)}
    assert losses[0] == 2 and losses[1] == H               # its report: the steps it took
    assert not errors, errors
