""""Did the room help?" on a room's page: the global eval loss against the tokens each worker
trained, beside each worker's training loss and the lone tab (the newest single run of the same
shape, batch, optimizer and lr: GET .../room/lone); without one, one click makes it and opens
its page in a new tab. Rooms and single runs are made through the API (no training here); the
session's server is shared with other files, so each test's lr is its own (a run of another
file never matches)."""

from __future__ import annotations

import json
import re

import httpx
from websockets.sync.client import connect

from e2e.room_api import a_room
from tests.browser import PAGE_WAIT_MS
from tests.small_model import SMALL
from tests.trainer_client import hello, record, ws_url

CHART = "[data-chart='the room beside one tab alone']"


def open_room(page, url: str, run: dict) -> None:
    page.goto(f"{url}/runs/{run['id']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)


def test_the_room_page_draws_the_lone_tab_beside_the_room_on_tokens_each_worker_trained(
        page, page_errors, live_server):
    lr = 2.7e-3
    room = a_room(live_server, lr)
    # A finished single run of the same shape: 4 steps of 2 x 32 tokens, evals at 2 and 4.
    lone = httpx.post(f"{live_server}/api/runs", json={
        **SMALL, "steps": 4, "batch_size": 2, "seed": 4, "lr": lr}).json()
    with connect(ws_url(live_server, f"/ws/runs/{lone['id']}")) as ws:
        assert hello(ws, lone["token"])["type"] == "welcome"
        evals = {2: 4.6, 4: 4.4}
        recs = [{**record(s, 6.0 - 0.3 * s), **({"eval_loss": evals[s]} if s in evals else {})}
                for s in range(1, 5)]
        ws.send(json.dumps({"type": "metrics", "records": recs}))
        assert json.loads(ws.recv(timeout=10))["type"] == "ack"
        ws.send(json.dumps({"type": "status", "status": "finished"}))
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"
    # (a newer run of another batch is not it)
    httpx.post(f"{live_server}/api/runs", json={**SMALL, "steps": 4, "batch_size": 4, "lr": lr})
    assert httpx.get(f"{live_server}/api/runs/{room['id']}/room/lone").json()["run"] == lone["id"]
    open_room(page, live_server, room)
    page.wait_for_function(f"document.querySelector(\"{CHART}\")?.dataset.loneSteps === '4'",
                           timeout=PAGE_WAIT_MS)
    chart = page.locator(CHART)
    assert chart.get_attribute("data-lone") == lone["id"]
    assert chart.get_attribute("data-lone-evals") == "2"
    assert chart.get_attribute("data-versions") == "3"
    assert chart.get_attribute("data-workers") == "2"
    # One x: tokens each worker trained. Versions 0, 1, 2 at 0, 128, 256 (v x 2 x 64); a
    # worker's inner step s of version v at (2v + s + 1) x 64; the lone tab's step n at n x 64.
    data = page.evaluate("window.andreaHelped.plot.data")
    assert data[0] == [0, 64, 128, 192, 256]
    cols = [[None if x is None else round(x, 6) for x in col] for col in data[1:]]
    assert cols[0] == [5.1, None, 4.7, None, 4.1]                    # the room's medians
    assert cols[1] == [None, 5.5, 5.4, 5.1, 5.0]                     # worker 0's inner losses
    assert cols[2] == [None, 5.7, 5.6, 5.3, 5.2]                     # worker 1's
    assert cols[3] == [None, None, 4.6, None, 4.4]                   # the lone tab's evals
    assert cols[4] == [None, 5.7, 5.4, 5.1, 4.8]                     # its training loss
    legend = chart.inner_text()
    for words in ("tokens each worker trained", "room: global eval loss", "worker 1: training loss",
                  "one tab alone: eval loss", "one tab alone: training loss"):
        assert words in legend, (words, legend)
    assert page.inner_text("#helped-text") == (
        "At 256 tokens each worker trained, the room's global eval loss is 4.1 and one tab "
        "alone's 4.4: the room is 0.3 lower: it helped.")
    assert page.inner_text("#lone-link") == httpx.get(
        f"{live_server}/api/runs/{lone['id']}").json()["name"]
    assert page.get_attribute("#lone-link", "href") == f"/runs/{lone['id']}"
    assert not page.is_visible("#train-alone")
    # The room's own charts are still there.
    assert page.get_attribute("[data-chart='global eval loss']", "data-versions") == "3"
    assert page.locator("[data-chart='inner loss per worker']").count() == 1
    assert not page.is_visible("#error"), page.inner_text("#error")
    assert not page_errors, page_errors


def test_without_a_lone_tab_one_click_makes_one_of_the_rooms_config_and_trains_it_in_a_new_tab(
        page, live_server):
    lr = 2.9e-3
    room = a_room(live_server, lr, rounds=1)
    open_room(page, live_server, room)
    page.wait_for_selector("#train-alone:visible", timeout=PAGE_WAIT_MS)
    assert page.inner_text("#train-alone") == "Train one tab alone for comparison"
    assert page.inner_text("#helped-text").startswith("No single run on this server trains what "
                                                      "one of the room's workers trains")
    assert page.get_attribute(CHART, "data-lone") == ""
    assert page.get_attribute(CHART, "data-versions") == "2"
    with page.expect_popup() as popup:
        page.click("#train-alone")
    tab = popup.value
    page.wait_for_function(f"document.querySelector(\"{CHART}\")?.dataset.lone",
                           timeout=PAGE_WAIT_MS)
    lone_id = page.get_attribute(CHART, "data-lone")
    # The new tab is the run's page, with its token (so it trains it there: run.js).
    tab.wait_for_url(re.compile(rf"/runs/{lone_id}(#.*)?$"), timeout=PAGE_WAIT_MS)
    tab.wait_for_load_state()
    tab.wait_for_function(
        f"Object.keys(sessionStorage).some((k) => k.endsWith({json.dumps(lone_id)}))",
        timeout=PAGE_WAIT_MS)
    assert tab.url.split("#")[0].endswith(f"/runs/{lone_id}")
    tab.close()
    made = httpx.get(f"{live_server}/api/runs/{lone_id}").json()
    mine = httpx.get(f"{live_server}/api/runs/{room['id']}").json()
    drop = ("room", "corpus_hash")
    assert {k: v for k, v in made["config"].items() if k not in drop} == \
        {k: v for k, v in mine["config"].items() if k not in drop}
    assert made["config"]["room"] is None and made["config"]["parent"] is None
    assert (made["config"]["steps"], made["config"]["seed"], made["config"]["lr"]) == (2, 4, lr)
    assert made["name"] == f"{mine['name']} · one tab alone"
    assert httpx.get(f"{live_server}/api/runs/{room['id']}/room/lone").json()["run"] == lone_id
    # The room's page shows it now, and no button.
    assert not page.is_visible("#train-alone")
    assert page.inner_text("#lone-link") == made["name"]
    # (its tab was closed at once: no eval yet, or one at its last step, step 2)
    assert re.match(r"One tab alone has no eval loss yet\.$|At ", page.inner_text("#helped-text"))
    assert not page.is_visible("#error"), page.inner_text("#error")
