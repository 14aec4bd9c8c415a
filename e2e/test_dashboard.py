"""The dashboard as people use it: readable charts, the compare page, runs that can be renamed
and deleted, every page at phone width, a 404 page. Runs are made through the API and their
records posted over the trainer socket (no training in a browser: fast)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from andrea.cli.launch import start_server, stop_server
from tests.browser import PAGE_WAIT_MS
from tests.trainer_client import new_run

STEPS = 40
SHOTS = Path(os.environ.get("ANDREA_SHOTS", "/tmp/shots"))
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}


def _send(live_server: str, run: dict, batches: list[list[dict]], status: str | None) -> None:
    with connect(live_server.replace("http://", "ws://") + f"/ws/runs/{run['id']}") as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"]}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        for records in batches:
            ws.send(json.dumps({"type": "metrics", "records": records}))
            assert json.loads(ws.recv(timeout=10))["type"] == "ack"
        if status:
            ws.send(json.dumps({"type": "status", "status": status,
                                "adapter": {"vendor": "google", "architecture": "swiftshader",
                                            "software": True}}))
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"


def recorded(live_server: str, optimizer: str = "adamw", lr: float = 3e-4,
             scale: float = 1.0, steps: int = STEPS, status: str | None = "finished",
             upto: int | None = None) -> dict:
    """A run with `upto` (default: all) steps recorded as a training tab would send them:
    warmup to `lr`, a falling loss, eval every 10 steps, step and optimizer times."""
    run = _new_run(live_server, optimizer, lr, steps)
    records = _records(upto or steps, lr, scale)
    _send(live_server, run, [records[i:i + 10] for i in range(0, len(records), 10)], status)
    return run


def _new_run(live_server: str, optimizer: str = "adamw", lr: float = 3e-4,
             steps: int = STEPS) -> dict:
    return new_run(live_server, optimizer=optimizer, steps=steps, lr=lr, warmup_steps=5,
                   eval_every=10)


def _records(upto: int, lr: float = 3e-4, scale: float = 1.0,
             eval_at=lambda s: s % 10 == 0) -> list[dict]:
    records = []
    for s in range(1, upto + 1):
        r = {"step": s, "loss": scale * (6.0 - 2.5 * (1 - 0.96 ** s)) + 0.03 * ((s * 7) % 5),
             "grad_norm": 2.0 * 0.97 ** s + 0.3, "clip_scale": 1.0 if s > 3 else 0.6,
             "lr": lr * min(1.0, s / 5), "step_ms": 420.0 + (s % 3), "opt_ms": 3.1,
             "tokens_per_s": 610.0 + s}
        if eval_at(s):
            r["eval_loss"] = scale * (6.1 - 2.4 * (1 - 0.96 ** s))
        records.append(r)
    return records


@pytest.fixture(scope="module")
def runs(live_server) -> dict[str, dict]:
    return {"adamw": recorded(live_server, "adamw"),
            "adamw_8bit": recorded(live_server, "adamw_8bit", scale=1.003),
            "live": recorded(live_server, "adamw", status="running", upto=17)}


def _ready(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("document.body?.dataset.ready === '1' || "
                           "Number(document.getElementById('charts')?.dataset.steps || 0) > 0",
                           timeout=PAGE_WAIT_MS)


def test_lr_chart_ticks_and_hover_show_small_values(page, live_server, runs, page_errors):
    run_id = runs["adamw"]["id"]
    page.set_viewport_size(DESKTOP)
    page.goto(f"{live_server}/runs/{run_id}")
    page.wait_for_function(f"document.getElementById('charts').dataset.steps === '{STEPS}'")
    page.wait_for_function("document.querySelector('[data-chart=\"learning rate\"]')"
                           f".dataset.points === '{STEPS}'")
    ticks = page.evaluate("window.andreaCharts.lr.plot.axes[1]._values")
    assert ticks and all(t not in ("0", "") for t in ticks if t), ticks
    assert any("e-4" in t for t in ticks), ticks
    assert len(set(ticks)) == len(ticks), ticks           # no two ticks read the same
    over = page.locator("[data-chart='learning rate'] .u-over")
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
    legend = page.locator("[data-chart='learning rate'] .u-legend .u-series").nth(1)
    value = legend.locator(".u-value").inner_text()
    assert value == "3e-4", value
    # The charts share their cursor: the loss chart's legend follows the same step.
    step = page.locator("[data-chart='learning rate'] .u-legend .u-series").nth(0) \
        .locator(".u-value").inner_text()
    loss_step = page.locator("[data-chart='loss'] .u-legend .u-series").nth(0) \
        .locator(".u-value").inner_text()
    assert step == loss_step and step.isdigit(), (step, loss_step)
    text = page.inner_text("#run")
    assert "100 %" in text and "elapsed" in text and "tokens seen" in text
    assert "eval loss" in text and "best" in text and "(software)" in text
    assert "ring waits" not in page.inner_text("#stats")
    assert page_errors == []


def test_progress_of_a_running_run(page, live_server):
    """While a trainer holds the run its page counts down the time left, but not while it is
    paused; once the trainer goes (a closed tab) the watching page says so at once, with no time
    left counting down, and so does the list. The speed has its unit; a sample shows its prompt
    apart from the model's text, and marks undecodable bytes and control characters."""
    run = _new_run(live_server)
    records = _records(17)
    with connect(live_server.replace("http://", "ws://") + f"/ws/runs/{run['id']}") as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"]}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        ws.send(json.dumps({"type": "metrics", "records": records}))
        assert json.loads(ws.recv(timeout=10))["type"] == "ack"
        ws.send(json.dumps({"type": "status", "status": "running"}))
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"
        page.goto(f"{live_server}/runs/{run['id']}")
        page.wait_for_function("document.getElementById('charts').dataset.steps === '17'")
        page.wait_for_function("document.body.dataset.shownStatus === 'running'")
        text = page.inner_text("#progress-box")
        assert "42 %" in text and "step 17 of 40" in text and "left" in text, text
        assert "about 9.7 s left" in text, text     # 23 steps of the median 421 ms
        assert page.inner_text("#mode") == "(watching)"
        assert "speed: 627 tokens/s" in page.inner_text("#stats")
        ws.send(json.dumps({"type": "status", "status": "paused"}))
        page.wait_for_function("document.body.dataset.shownStatus === 'paused'")
        assert "left" not in page.inner_text("#progress-box")
        ws.send(json.dumps({"type": "status", "status": "running"}))
        page.wait_for_function("document.getElementById('progress-text').textContent"
                               ".includes('left')")
        ws.send(json.dumps({"type": "sample", "step": 17,
                            "text": "def f(x):\u27e8\u2026\u27e9 return \ufffd\u001b"}))
        sample = page.locator("#samples [data-step='17']")
        sample.wait_for()
        assert sample.locator(".sample-prompt").text_content() == "def f(x):"
        assert sample.locator(".sample-out").text_content() == " return \ufffd\u241b"
        marks = sample.locator(".sample-mark")
        assert [marks.nth(i).get_attribute("data-mark") for i in range(2)] == \
            ["undecodable", "control"]
        assert "not valid UTF-8" in marks.nth(0).get_attribute("title")
        assert "\u27e8" not in sample.text_content()
    # The trainer's socket is gone: the page hears it live (no reload).
    page.wait_for_function("document.body.dataset.shownStatus === 'no training tab'",
                           timeout=15_000)
    assert page.inner_text("#status") == "no training tab"
    assert "gone" in page.inner_text("#why")
    text = page.inner_text("#progress-box")
    assert "step 17 of 40" in text and "left" not in text, text
    assert page.locator("#resume-run").is_hidden()       # no checkpoint to resume from
    page.goto(f"{live_server}/runs")
    page.wait_for_function("document.body.dataset.ready === '1'")
    cell = page.locator(f"tr[data-run-id='{run['id']}'] td.status")
    assert cell.inner_text() == "no training tab"


def test_compare_chooses_a_baseline_and_plots_the_difference(page, live_server, runs,
                                                              page_errors):
    a, b = runs["adamw"]["id"], runs["adamw_8bit"]["id"]
    page.goto(f"{live_server}/compare?ids={b},{a}")      # 8-bit first: fp32 is still the base
    page.wait_for_function("document.body?.dataset.ready === '1'")
    assert page.input_value("#baseline") == a
    assert page.get_attribute("#charts", "data-series") == "2"
    diff = "[data-chart='difference to baseline']"
    assert page.get_attribute(diff, "data-points") == str(STEPS)
    assert page.get_attribute(diff, "data-baseline") == a
    for title in ("loss", "eval loss", "grad norm", "learning rate", "step time",
                  "optimizer time (GPU)"):
        assert page.get_attribute(f"[data-chart='{title}']", "data-points") == str(STEPS), title
    row = page.locator(f"#summary tr[data-run-id='{a}']")
    assert "reference" in row.inner_text()
    assert "+" in page.inner_text(f"#summary tr[data-run-id='{b}']")
    assert "optimizer" in page.inner_text("#config-diff")          # the settings that differ
    page.select_option("#baseline", b)
    assert page.get_attribute(diff, "data-baseline") == b
    assert "reference" in page.inner_text(f"#summary tr[data-run-id='{b}']")
    assert "-" in page.inner_text(f"#summary tr[data-run-id='{a}']")
    assert f"baseline={b}" in page.url
    assert page_errors == []


def test_compare_without_ids_says_how_to_pick_runs(page, live_server):
    page.goto(f"{live_server}/compare")
    page.wait_for_function("document.body?.dataset.ready === '1'")
    assert page.locator("#pick").is_visible()
    assert "tick two or more" in page.inner_text("#pick")
    assert not page.locator("#charts").is_visible()


def run_name(live_server: str, run_id: str) -> str:
    return httpx.get(f"{live_server}/api/runs/{run_id}").json()["name"]


def focused(locator) -> bool:
    return locator.evaluate("e => e === document.activeElement")


def test_rename_and_delete_a_run_from_the_list(page, live_server):
    run = recorded(live_server, "adamw", upto=3, status="stopped")
    rid = run["id"]
    assert httpx.get(f"{live_server}/api/runs/{rid}").json()["name"].startswith("tiny adamw #")
    page.goto(f"{live_server}/runs")
    page.wait_for_function("document.body.dataset.ready === '1'")
    row = f"tr[data-run-id='{rid}']"
    # Renaming is in place (no native prompt): an input holding the name, focused; Escape
    # cancels, Enter saves, and the focus goes back to the row's Rename button.
    prompts = []

    def no_dialog(dialog):
        prompts.append(dialog.type)
        dialog.dismiss()
    page.on("dialog", no_dialog)
    editor = page.locator(f"{row} td.name input")
    page.click(f"{row} button.rename")
    assert focused(editor) and editor.input_value() == run_name(live_server, rid)
    assert editor.get_attribute("aria-label").startswith("New name for tiny adamw #")
    page.keyboard.type("never saved")
    page.keyboard.press("Escape")
    assert editor.count() == 0 and focused(page.locator(f"{row} button.rename"))
    page.click(f"{row} button.rename")
    editor.fill("")
    page.click(f"{row} td.name button.save")
    assert page.inner_text(f"{row} td.name [role=alert]") == "A run needs a name."
    editor.fill("my baseline")
    editor.press("Enter")
    page.wait_for_function(f"document.querySelector(\"{row} td.name a\")?.textContent"
                           " === 'my baseline'")
    assert run_name(live_server, rid) == "my baseline" and prompts == []
    page.remove_listener("dialog", no_dialog)
    page.fill("#filter", "my baseline")
    assert page.locator("#runs tbody tr").count() == 1
    page.fill("#filter", "")
    # Deleting asks first; "cancel" keeps the run.
    page.once("dialog", lambda d: d.dismiss())
    page.click(f"{row} button.delete")
    assert httpx.get(f"{live_server}/api/runs/{rid}").status_code == 200
    page.once("dialog", lambda d: d.accept())
    page.click(f"{row} button.delete")
    page.wait_for_function(f"!document.querySelector(\"{row}\")")
    assert httpx.get(f"{live_server}/api/runs/{rid}").status_code == 404
    assert rid not in [r["id"] for r in httpx.get(f"{live_server}/api/runs").json()]


def test_runs_list_updates_itself(page, live_server):
    page.goto(f"{live_server}/runs")
    page.wait_for_function("document.body.dataset.ready === '1'")
    source = httpx.get(f"{live_server}/api/corpus?preset=tiny",        # read on the first ask
                       timeout=120).json()["sources"][0]["name"]
    every = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny"}).json()
    run = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny", "sources": [source]}).json()
    page.wait_for_selector(f"tr[data-run-id='{run['id']}']", timeout=15_000)
    # Its corpus: the source it trains on (a run on every source reads "all"), the hash in
    # the title.
    corpus = page.locator(f"tr[data-run-id='{run['id']}'] td.corpus > span")
    assert corpus.inner_text() == source
    assert corpus.get_attribute("title") == f"corpus {run['config']['corpus_hash']}: {source}"
    assert page.inner_text(f"tr[data-run-id='{every['id']}'] td.corpus") == "all"
    for r in (every, run):
        httpx.delete(f"{live_server}/api/runs/{r['id']}")


def test_unknown_run_page_is_404(page, live_server):
    response = page.goto(f"{live_server}/runs/nope")
    assert response.status == 404
    assert "There is no run nope" in page.inner_text("main")
    assert page.locator("#resume-run").count() == 0


def _pages(live_server: str, runs: dict[str, dict]) -> dict[str, str]:
    a, b = runs["adamw"]["id"], runs["adamw_8bit"]["id"]
    return {"start": "/", "runs": "/runs", "run": f"/runs/{a}",
            "run-live": f"/runs/{runs['live']['id']}", "compare": f"/compare?ids={a},{b}",
            "compare-empty": "/compare", "kernels": "/kernels", "diagnostics": "/diagnostics",
            "missing": "/runs/nope"}


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390", "1440"])
def test_no_page_scrolls_sideways_and_screenshots(browser, live_server, runs, viewport):
    """At 390 px every page fits the viewport (wide tables scroll inside their card); a
    screenshot of each page at both widths goes to /tmp/shots (ANDREA_SHOTS)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context(viewport=viewport)
    page = ctx.new_page()
    wide = {}
    for name, path in _pages(live_server, runs).items():
        page.goto(live_server + path)
        if name == "diagnostics":
            page.wait_for_function("document.body.dataset.webgpu !== undefined",
                                   timeout=PAGE_WAIT_MS)
        elif name.startswith("run"):
            page.wait_for_function("document.body.dataset.ready === '1' || "
                                   "Number(document.getElementById('charts')?.dataset.steps"
                                   " || 0) > 0", timeout=PAGE_WAIT_MS)
        else:
            page.wait_for_load_state("networkidle")
        page.wait_for_timeout(300)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > viewport["width"]:
            wide[name] = width
        page.screenshot(path=str(SHOTS / f"{name}-{viewport['width']}.png"), full_page=True)
    ctx.close()
    assert not wide, f"pages wider than {viewport['width']} px: {wide}"


def test_bandit_run_shows_per_source_loss_and_weights(page, live_server):
    """A run with the source bandit: each source's loss and its sampling weight per phase, and
    the phase marks from the first phase on."""
    run = httpx.post(f"{live_server}/api/runs", json={
        "preset": "tiny", "steps": 200, "batch_size": 4, "data_mode": "bandit"}).json()
    rid, step, batches = run["id"], 0, []
    with connect(live_server.replace("http://", "ws://") + f"/ws/runs/{rid}") as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"]}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        while step < 45:
            httpx.get(f"{live_server}/api/runs/{rid}/batches/{step}", timeout=60)   # the phase
            info = httpx.get(f"{live_server}/api/runs/{rid}/data", timeout=60).json()
            phase = info["phases"][-1]
            end = phase["start"] + phase["length"]
            batches.append([{"step": s + 1, "loss": 5.0 - 0.01 * s, "grad_norm": 1.0,
                             "clip_scale": 1.0, "lr": 1e-3, "phase": phase["index"],
                             "source_losses": {str(i): 5.0 + 0.3 * i - 0.02 * s
                                               for i in range(len(info["sources"]))}}
                            for s in range(step, end)])
            ws.send(json.dumps({"type": "metrics", "records": batches[-1]}))
            reply = json.loads(ws.recv(timeout=10))
            assert reply["type"] == "ack", reply
            step = end
    page.set_viewport_size(DESKTOP)
    page.goto(f"{live_server}/runs/{rid}")
    page.wait_for_function(f"document.getElementById('charts').dataset.steps === '{step}'")
    page.wait_for_function("Number(document.querySelector('[data-chart=\"sampling weight per "
                           "source\"]')?.dataset.points || 0) > 0")
    # Each chart draws in its own frame: wait for this one's points rather than read them now.
    page.wait_for_function("document.querySelector('[data-chart=\"loss per source\"]')"
                           f"?.dataset.points === '{step}'")
    marks = page.evaluate("window.andreaCharts.loss.marks()")
    assert marks and min(marks) <= batches[0][-1]["step"] + 1, marks
    page.screenshot(path=str(SHOTS / "run-bandit-1440.png"), full_page=True)


# Where each line series of a chart has a lone point, whether the canvas shows it: the point's
# series (the filter uPlot draws markers from) and the pixels around it in the series' colour.
LONE_POINTS_JS = """(key) => {
  const u = window.andreaCharts[key].plot;
  const rgb = (c) => { const x = document.createElement('canvas').getContext('2d');
    x.fillStyle = c; const h = x.fillStyle.slice(1);
    return [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16)); };
  const out = [];
  for (let si = 1; si < u.series.length; si++) {
    const s = u.series[si];
    const ys = u.data[si];
    const i = ys.findIndex((v) => v !== null && v !== undefined);
    if (i < 0) continue;
    const x = Math.round(u.valToPos(u.data[0][i], 'x', true));
    const y = Math.round(u.valToPos(ys[i], 'y', true));
    const want = rgb(typeof s.stroke === 'function' ? s.stroke(u, si) : s.stroke);
    const px = u.ctx.getImageData(x - 3, y - 3, 7, 7).data;
    let hits = 0;
    for (let k = 0; k < px.length; k += 4) {
      const d = Math.abs(px[k] - want[0]) + Math.abs(px[k + 1] - want[1])
        + Math.abs(px[k + 2] - want[2]);
      if (px[k + 3] > 128 && d < 90) hits++;
    }
    out.push({ label: s.label, marked: s.points.filter(u, si, false, null), hits });
  }
  return out;
}"""


def test_single_eval_points_are_drawn_on_compare_and_run_pages(page, live_server, page_errors):
    """Short runs evaluate once (at their last step): on /compare each run's eval loss is one
    point, which a line alone never shows: it gets a marker. A run's first step alone too."""
    page.set_viewport_size(DESKTOP)
    steps = 20
    ids = []
    for scale in (1.0, 1.08):
        run = _new_run(live_server, steps=steps)
        _send(live_server, run, [_records(steps, scale=scale, eval_at=lambda s: s == steps)],
              "finished")
        ids.append(run["id"])
    page.goto(f"{live_server}/compare?ids={','.join(ids)}")
    page.wait_for_function("document.body?.dataset.ready === '1'")
    page.wait_for_timeout(300)          # (uPlot draws on the next frame)
    drawn = page.evaluate(LONE_POINTS_JS, "eval")
    assert len(drawn) == 2, drawn
    for d in drawn:
        assert d["marked"] == [steps - 1], d            # the lone point gets a marker...
        assert d["hits"] >= 4, d                        # ...and it is on the canvas
    # The dense lines get no markers.
    assert all(d["marked"] is None for d in page.evaluate(LONE_POINTS_JS, "loss"))
    # A run page with one step so far: its loss is a visible point, not an empty chart.
    one = _new_run(live_server)
    _send(live_server, one, [_records(1)], "running")
    page.goto(f"{live_server}/runs/{one['id']}")
    page.wait_for_function("document.getElementById('charts').dataset.steps === '1'")
    page.wait_for_timeout(300)
    drawn = page.evaluate(LONE_POINTS_JS, "loss")       # train and smoothed: one spot
    assert [d["label"] for d in drawn[:2]] == ["train", "smoothed"], drawn
    assert all(d["marked"] == [0] for d in drawn[:2]), drawn
    assert drawn[1]["hits"] >= 4, drawn                  # the one drawn last, on top
    assert page_errors == []


def test_a_run_no_tab_takes_reads_never_started(browser, tmp_path):
    """A run made through the API that no training tab takes: its page and the list say
    "waiting for a training tab", then, once the grace period (ANDREA_START_GRACE_S, short
    here) has passed, "never started", live on the open page."""
    grace = 8
    proc, url = start_server(tmp_path / "data", env={"ANDREA_START_GRACE_S": str(grace)})
    try:
        httpx.post(f"{url}/api/runs", json={"preset": "tiny", "steps": 30},
                   timeout=120).raise_for_status()     # the corpus is read on the first one
        ctx = browser.new_context()
        page = ctx.new_page()
        t0 = time.monotonic()
        run = httpx.post(f"{url}/api/runs", json={"preset": "tiny", "steps": 30}).json()
        page.goto(f"{url}/runs/{run['id']}")
        page.wait_for_function("document.body.dataset.shownStatus !== undefined")
        if time.monotonic() - t0 < grace - 1:
            assert page.inner_text("#status") == "waiting for a training tab"
            assert page.inner_text("#mode") == "(watching)"
        page.wait_for_function("document.body.dataset.shownStatus === 'never started'",
                               timeout=(grace + 20) * 1000)
        assert time.monotonic() - t0 >= grace - 0.5
        assert page.inner_text("#status") == "never started"
        assert f"within {grace} s" in page.inner_text("#why")
        assert page.inner_text("#mode") == ""
        charts = page.inner_text("#charts")
        assert "Never started" in charts and "Waiting for the first step" not in charts
        assert page.locator("#resume-run").is_hidden()
        listing = ctx.new_page()
        listing.goto(f"{url}/runs")
        listing.wait_for_function("document.body.dataset.ready === '1'")
        cell = listing.locator(f"tr[data-run-id='{run['id']}'] td.status")
        assert cell.inner_text() == "never started"
        assert "within" in cell.get_attribute("title")
        ctx.close()
    finally:
        stop_server(proc)
