"""A user's run, end to end: the new-run form in real Chromium (SwiftShader WebGPU), a live
uvicorn, the websocket, SQLite on disk, the charts, a second viewer tab, the compare page."""

import json
import re
import sqlite3
import time

import httpx
import pytest
from websockets.sync.client import connect

from andrea.web.auth import token_init_script
from tests.browser import PAGE_WAIT_MS
from tests.small_model import SMALL

STEPS = 30
TIMEOUT = 300_000


def fill(page, **fields):
    """The new-run form's number inputs, by name."""
    for name, value in fields.items():
        page.fill(f"input[name={name}]", str(value))


def start_run(page, live_server, optimizer):
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.select_option("#preset", SMALL["preset"])
    page.check(f"input[name=optimizer][value={optimizer}]")
    page.click("#shape summary")      # the model's own shape: the suite's small model
    fill(page, **{k: v for k, v in SMALL.items() if k != "preset"})
    fill(page, batch_size=4, steps=STEPS, warmup_steps=3, lr=0.004, eval_every=10,
         sample_every=15)
    page.wait_for_function("!document.getElementById('start').disabled")
    page.click("#start")
    page.wait_for_url("**/runs/*")
    return page.url.rsplit("/", 1)[1]


def check_run_in_db(data_dir, run_id):
    db = sqlite3.connect(data_dir / "andrea.sqlite")
    rows = db.execute("SELECT step, loss, grad_norm, clip_scale FROM metrics WHERE run_id = ?"
                      " ORDER BY step", (run_id,)).fetchall()
    assert [r[0] for r in rows] == list(range(1, STEPS + 1)), "each step exactly once"
    for step, loss, norm, clip in rows:
        assert loss is not None and norm is not None and 0 < clip <= 1, (step, loss, norm, clip)
    losses = [r[1] for r in rows]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"\nrun {run_id}: mean loss first 10 steps {first:.4f}, last 10 {last:.4f}")
    assert last < first
    status = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    assert status == "finished"
    return losses


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_8bit"])
def test_train_from_the_ui(page, live_server, server_data_dir, page_errors, optimizer):
    run_id = start_run(page, live_server, optimizer)
    page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("main")
    # The chart shows every step, and every step is on disk exactly once.
    assert page.get_attribute("[data-chart=loss]", "data-points") == str(STEPS)
    check_run_in_db(server_data_dir, run_id)
    api = httpx.get(f"{live_server}/api/runs/{run_id}").json()
    assert api["config"]["optimizer"] == optimizer
    assert {k: api["config"][k] for k in SMALL} == SMALL     # the shape the form was given
    assert api["samples"], "a text sample was generated and stored"
    metrics = httpx.get(f"{live_server}/api/runs/{run_id}/metrics").json()
    assert any(m.get("eval_loss") for m in metrics)
    # SwiftShader has timestamp-query: every step reports its optimizer phase's GPU time.
    assert all(m.get("opt_ms", 0) > 0 for m in metrics), [m.get("opt_ms") for m in metrics]
    print(f"{optimizer}: median optimizer GPU time "
          f"{sorted(m['opt_ms'] for m in metrics)[len(metrics) // 2]:.2f} ms")
    stats = page.evaluate("window.andreaTrainer.stats")
    print(f"{optimizer}: readback ring waits {stats['ringWaits']}, "
          f"GPU starved {stats['gpuStarved']}")
    assert page_errors == []


def test_second_tab_watches_live(browser, live_server, server_data_dir):
    ctx = browser.new_context()
    trainer = ctx.new_page()
    run_id = start_run(trainer, live_server, "adamw")
    trainer.wait_for_function("Number(document.getElementById('charts').dataset.steps || 0) >= 3",
                              timeout=TIMEOUT)
    trainer.click("#pause")   # so the run cannot end before the viewer is connected
    # Paused: no time left is counted, though no record came since (the status alone says so).
    trainer.wait_for_function("document.body.dataset.status === 'paused'", timeout=PAGE_WAIT_MS)
    assert "left" not in trainer.inner_text("#progress-text")
    viewer = browser.new_context().new_page()   # another tab, no token: watches
    viewer.goto(f"{live_server}/runs/{run_id}")
    viewer.wait_for_function("document.body.dataset.socket === 'connected'", timeout=PAGE_WAIT_MS)
    first = int(viewer.evaluate("document.getElementById('charts').dataset.steps || '0'"))
    assert first < STEPS
    trainer.click("#resume")
    viewer.wait_for_function(f"document.getElementById('charts').dataset.steps === '{STEPS}'",
                             timeout=TIMEOUT)
    assert viewer.inner_text("#mode") == "(watching)"
    trainer.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    check_run_in_db(server_data_dir, run_id)
    ctx.close()


def recorded_run(live_server, optimizer) -> str:
    """A finished run of STEPS steps, reported over the telemetry socket as a training tab
    would (falling loss, step and optimizer times), without training it."""
    run = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny", "optimizer": optimizer,
                                                      "steps": STEPS}).json()
    scale = 1.0 if optimizer == "adamw" else 1.01
    records = [{"step": s, "loss": scale * (6.0 - 0.05 * s), "grad_norm": 1.0,
                "clip_scale": 1.0, "lr": 1e-3, "step_ms": 20.0, "opt_ms": 1.0}
               for s in range(1, STEPS + 1)]
    with connect(live_server.replace("http://", "ws://") + f"/ws/runs/{run['id']}") as ws:
        for message in ({"type": "hello", "token": run["token"]},
                        {"type": "metrics", "records": records}):
            ws.send(json.dumps(message))
            assert json.loads(ws.recv(timeout=10))["type"] in ("welcome", "ack")
        ws.send(json.dumps({"type": "status", "status": "finished"}))
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"
    return run["id"]


@pytest.fixture
def two_runs(live_server) -> dict[str, str]:
    return {opt: recorded_run(live_server, opt) for opt in ("adamw", "adamw_8bit")}


def test_compare_page_overlays_both(page, live_server, two_runs):
    runs = two_runs
    page.goto(f"{live_server}/runs")
    page.wait_for_function("document.body.dataset.ready === '1'")
    for run_id in runs.values():
        page.check(f"tr[data-run-id='{run_id}'] input[type=checkbox]")
    page.click("#compare")
    page.wait_for_url("**/compare?ids=*")   # else the old page's ready flag could answer
    page.wait_for_function("document.body?.dataset.ready === '1'")
    assert page.get_attribute("#charts", "data-series") == "2"
    assert page.get_attribute("[data-chart=loss]", "data-points") == str(STEPS)
    text = page.inner_text("#summary")
    assert "adamw_8bit" in text and "adamw" in text
    assert "reference" in text and " %" in text   # the loss gap of the second run to the first


def test_form_leaves_defaults_to_the_server(page, live_server):
    """The form's defaults and bounds are RunConfig's: an empty warmup is the server's default
    (so 5 steps are not refused for a warmup of 20), an empty learning rate is required."""
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.wait_for_function("!document.getElementById('start').disabled")
    assert page.input_value("input[name=warmup_steps]") == ""
    page.fill("input[name=lr]", "")
    page.click("#start")
    assert "Learning rate is required" in page.inner_text("#form-error")
    assert page.url.rstrip("/") == live_server       # nothing was sent
    fill(page, lr=0.003, steps=5, eval_every=0, sample_every=0)
    page.click("#start")
    page.wait_for_url("**/runs/*")
    run = httpx.get(f"{live_server}/api/runs/{page.url.rsplit('/', 1)[1]}").json()
    assert run["config"]["steps"] == 5 and run["config"]["warmup_steps"] == 0


def test_leaving_a_training_tab_asks_first(browser, live_server):
    """The weights and optimizer state live only on the training tab's GPU, so closing it
    mid-run raises the browser's leave-page prompt (once the user has interacted with it)."""
    ctx = browser.new_context()
    page = ctx.new_page()
    start_run(page, live_server, "adamw")
    page.wait_for_function("Number(document.getElementById('charts').dataset.steps || 0) >= 1",
                           timeout=TIMEOUT)
    page.click("#logscale")   # browsers only prompt on pages the user has interacted with
    with page.expect_event("dialog", timeout=10_000) as prompt:
        page.close(run_before_unload=True)
    assert prompt.value.type == "beforeunload"
    prompt.value.dismiss()    # "stay": the run goes on
    page.wait_for_function("Number(document.getElementById('charts').dataset.steps) >= 3",
                           timeout=TIMEOUT)
    ctx.close()


def train_here(context, live_server, run):
    """A page of `context` that trains `run` (its token in sessionStorage, as the start page
    leaves it)."""
    page = context.new_page()
    page.add_init_script(token_init_script(run["id"], run["token"]))
    page.goto(f"{live_server}/runs/{run['id']}")
    return page


def test_a_short_run_with_the_defaults_ends_with_a_sample_and_an_eval(browser, live_server):
    """sample_every 100 and eval_every 50 (the defaults) in an 8-step run: a sample early (at a
    quarter of the run) and one at the last step, which is also evaluated."""
    run = httpx.post(f"{live_server}/api/runs", json={**SMALL, "steps": 8,
                                                      "batch_size": 4}).json()
    assert (run["config"]["sample_every"], run["config"]["eval_every"]) == (100, 50)
    ctx = browser.new_context()
    page = train_here(ctx, live_server, run)
    page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("main")
    shown = page.evaluate("[...document.querySelectorAll('#samples [data-step]')]"
                          ".map((d) => Number(d.dataset.step))")
    assert sorted(shown) == [2, 8], shown
    api = httpx.get(f"{live_server}/api/runs/{run['id']}").json()
    assert [s["step"] for s in api["samples"]] == [2, 8] and all(s["text"] for s in api["samples"])
    metrics = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics").json()
    assert [m["step"] for m in metrics if "eval_loss" in m] == [8]
    assert api["last_eval_loss"] is not None
    assert "eval loss" in page.inner_text("#stats")
    # A page that opens it afterwards shows them too.
    viewer = browser.new_context().new_page()
    viewer.goto(f"{live_server}/runs/{run['id']}")
    viewer.wait_for_function("document.getElementById('charts').dataset.steps === '8'")
    assert "eval loss" in viewer.inner_text("#stats")
    # The watch socket's backlog sends the records, then the samples: wait for those too.
    viewer.wait_for_function("document.querySelectorAll('#samples [data-step]').length >= 2",
                             timeout=PAGE_WAIT_MS)
    assert viewer.locator("#samples [data-step]").count() == 2
    viewer.context.close()
    ctx.close()


def test_a_closed_training_tab_reads_no_training_tab(browser, live_server):
    """The tab training a run goes (closed, crashed): a page watching the run says "no training
    tab" at once, offers Resume, and no longer counts a time left down; the list says so too."""
    run = httpx.post(f"{live_server}/api/runs", json={
        "preset": "tiny", "steps": 200, "batch_size": 2, "checkpoint_every": 2,
        "eval_every": 0, "sample_every": 0}).json()
    ctx = browser.new_context()
    trainer = train_here(ctx, live_server, run)
    trainer.wait_for_function("Number(document.body.dataset.checkpoint || 0) >= 2",
                              timeout=TIMEOUT)
    viewer = browser.new_context().new_page()
    viewer.goto(f"{live_server}/runs/{run['id']}")
    viewer.wait_for_function("document.body.dataset.shownStatus === 'running'")
    viewer.wait_for_function("document.getElementById('progress-text').textContent"
                             ".includes('left')", timeout=PAGE_WAIT_MS)
    assert viewer.locator("#resume-run").is_hidden()     # its tab holds it
    ctx.close()              # the training tab goes, without a word to the server
    viewer.wait_for_function("document.body.dataset.shownStatus === 'no training tab'",
                             timeout=30_000)
    assert viewer.inner_text("#status") == "no training tab"
    assert "last checkpoint" in viewer.inner_text("#why")
    viewer.wait_for_selector("#resume-run:not([hidden])")
    assert "left" not in viewer.inner_text("#progress-text")
    info = httpx.get(f"{live_server}/api/runs/{run['id']}").json()
    assert info["status"] == "running" and info["connected"] is False and info["can_resume"]
    viewer.goto(f"{live_server}/runs")
    viewer.wait_for_function("document.body.dataset.ready === '1'")
    cell = viewer.locator(f"tr[data-run-id='{run['id']}'] td.status")
    assert cell.inner_text().startswith("no training tab · resumable from step"), \
        cell.inner_text()
    viewer.context.close()


def test_a_tab_whose_run_was_taken_over_stops_and_says_why(browser, live_server):
    """The run is resumed elsewhere while its tab is cut off from the server (POST .../resume: a
    new token). When the tab gets through again, the server refuses its old token for good
    (1008): the tab stops training, shows the server's reason and ends (body.dataset.done, what
    `andrea train` waits for) instead of waiting on its socket forever; the run's committed
    records are as the resume left them."""
    run = httpx.post(f"{live_server}/api/runs", json={
        "preset": "tiny", "steps": 200, "batch_size": 2, "checkpoint_every": 2,
        "eval_every": 0, "sample_every": 0}).json()
    cut = {"off": False, "live": []}

    def trainer_socket(ws):   # the page's trainer socket, through to the server unless cut off
        if cut["off"]:
            ws.close(code=4000, reason="cut off by the test")   # the page retries
            return
        cut["live"].append((ws, ws.connect_to_server()))

    ctx = browser.new_context()
    page = ctx.new_page()
    page.route_web_socket(re.compile(r"/ws/runs/[^/?]+$"), trainer_socket)
    page.add_init_script(token_init_script(run["id"], run["token"]))
    page.goto(f"{live_server}/runs/{run['id']}")
    page.wait_for_function("Number(document.body.dataset.checkpoint || 0) >= 2", timeout=TIMEOUT)
    cut["off"] = True
    for ws, server in cut["live"]:
        server.close()
        ws.close(code=4000, reason="cut off by the test")
    deadline = time.monotonic() + 60
    while not httpx.get(f"{live_server}/api/runs/{run['id']}").json()["can_resume"]:
        assert time.monotonic() < deadline, "the server never let the tab's socket go"
        page.wait_for_timeout(100)   # Playwright serves the page's reconnects meanwhile
    taken = httpx.post(f"{live_server}/api/runs/{run['id']}/resume")
    assert taken.status_code == 200, taken.text
    step = taken.json()["step"]
    committed = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics").json()
    cut["off"] = False        # the tab's next reconnect reaches the server with its old token
    page.wait_for_function("document.body.dataset.done", timeout=120_000)
    assert page.evaluate("document.body.dataset.done") == "failed"
    assert page.locator("#error").is_visible()
    assert "resumed elsewhere" in page.inner_text("#error")
    assert "revoked" in page.evaluate("document.body.dataset.refused")
    assert page.locator("#trainer-controls").is_hidden()
    after = httpx.get(f"{live_server}/api/runs/{run['id']}/metrics").json()
    assert [m["step"] for m in after] == list(range(1, step + 1))
    assert after == committed     # the old tab wrote nothing more
    info = httpx.get(f"{live_server}/api/runs/{run['id']}").json()
    assert info["status"] == "created" and not info["has_weights"], info
    ctx.close()
