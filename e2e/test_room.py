"""A room run end to end: three Chromium pages join from the room's join link and a fourth
worker through `andrea train --join`, and they train the suite's small model
(tests/small_model.py) together (SwiftShader WebGPU); a fifth page joins and leaves mid-run.
The server averages their int8 pseudo-gradients round by round, and the room's page shows every
worker. Every worker here joins from 127.0.0.1: each room allows as many per address
(workers_per_address) as the test runs at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx

from tests.browser import PAGE_WAIT_MS
from tests.small_model import SMALL, cli_args

H, ROUNDS, WORKERS = 4, 3, 4
TIMEOUT = 600_000


def all_reports(room_url: str, limit: int = 2) -> list[dict]:
    """Every report, page by page (`limit` a page: small, so the paging itself is exercised)."""
    reports, offset = [], 0
    while offset is not None:
        page = httpx.get(f"{room_url}/reports", params={"offset": offset, "limit": limit}).json()
        reports += page["reports"]
        assert page["total"] >= len(reports)
        offset = page["next"]
    assert len(reports) == page["total"]
    return reports


def wait_room(url: str, until, page=None) -> dict:
    """The room once `until(room)` holds (GET polled). With `page`, it waits through the page
    (Playwright's sync API runs the route handlers that hold or release requests only inside
    its own calls: a plain sleep left them pending)."""
    deadline = time.monotonic() + TIMEOUT / 1000
    while not until(room := httpx.get(url).json()):
        assert time.monotonic() < deadline, room
        page.wait_for_timeout(200) if page is not None else time.sleep(0.2)
    return room


def test_four_pages_train_one_model_and_a_fifth_joins_and_leaves(browser, live_server):
    r = httpx.post(f"{live_server}/api/runs", json={
        **SMALL, "steps": H * ROUNDS, "batch_size": 2, "seed": 7, "lr": 0.004,
        "warmup_steps": 2,
        # Rounds close when every worker answered, never at the deadline: the pages' batches
        # are held while a fifth joins and leaves, which took past 300 s beside a second suite.
        "room": {"inner_steps": H, "codec": "int8", "max_workers": 8, "round_deadline_s": 3600,
                 "workers_per_address": WORKERS + 1}})
    assert r.status_code == 201, r.text
    run = r.json()
    link = f"{live_server}/runs/{run['id']}#join={run['room']['join_token']}"
    pages, errors = [], []
    # Every worker trains every round, whatever the machine's load: the pages' batches of the
    # first round are held until all four have joined (a worker alone in the room closes a
    # round by itself: the CLI's, starting first, once closed round 0 before the pages joined),
    # and those of the last round until the fifth has left, so the room cannot finish first
    # (its Leave button goes once its worker ends).
    held, left, first, joined = [], [], [], []

    def hold(until: list, into: list):
        def handler(route):
            if until:
                route.continue_()
            else:
                into.append(route)
        return handler
    for _ in range(WORKERS - 1):
        page = browser.new_context().new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.context.route("**/room/batches/0/**", hold(joined, first))
        page.context.route(f"**/room/batches/{ROUNDS - 1}/**", hold(left, held))
        page.goto(link)
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
        assert page.url.endswith(f"/runs/{run['id']}")          # the token left the bar
        pages.append(page)
    room_url = f"{live_server}/api/runs/{run['id']}/room"
    for page in pages:
        page.click("#join")
    wait_room(room_url, lambda r: len(r["workers"]) == WORKERS - 1, pages[0])
    cli = subprocess.Popen([sys.executable, "-m", "andrea", "train", "--join", run["id"],
                            "--token", run["room"]["join_token"], "--server", live_server,
                            "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_room(room_url, lambda r: len(r["workers"]) == WORKERS, pages[0])
    joined.append(True)
    for route in first:
        route.continue_()
    # A fifth joins once the room trains version 1, then leaves: the rounds go on without it.
    extra = browser.new_context().new_page()
    extra.goto(link)
    extra.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    wait_room(room_url, lambda r: r["version"] >= 1, pages[0])
    extra.click("#join")
    extra.wait_for_function("document.body.dataset.workerStatus === 'running'", timeout=TIMEOUT)
    extra.click("#leave")
    extra.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    left.append(True)
    for route in held:
        route.continue_()
    for page in pages:
        page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
        assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("main")
    out, err = cli.communicate(timeout=TIMEOUT / 1000)
    assert cli.returncode == 0, out + err
    result = json.loads(out)
    assert result["ok"] and result["version"] == ROUNDS and "#join=" in result["join_link"]
    assert not errors, errors

    room = httpx.get(room_url).json()
    assert room["finished"] and room["version"] == ROUNDS
    workers = {w["worker"]: w for w in room["workers"]}
    assert len(workers) == WORKERS + 1
    gone = [w for w in workers.values() if w["left"] is not None]
    assert len(gone) == 1 and gone[0]["deltas"] < ROUNDS
    assert sorted(w["deltas"] for w in workers.values() if w["left"] is None) == [ROUNDS] * WORKERS
    assert all(len(c["workers"]) >= WORKERS for c in room["closed"])   # every page, every round
    assert all(c["refused"] == {} for c in room["closed"])
    # int8 pseudo-gradients: ~4x less than f32, and per round far below per-step all-reduce.
    assert room["delta_bytes"] < 0.26 * 4 * room["numel"]
    assert room["allreduce_bytes_per_step"] * H / room["delta_bytes"] > 4 * H * 0.95
    # The global model learned: each version's eval loss (the median of the workers' measures
    # of it) falls.
    evals = {e["version"]: e["median"] for e in room["evals"]}
    assert sorted(evals) == list(range(ROUNDS + 1)), evals
    print(f"\nglobal eval loss by version: {[round(evals[v], 4) for v in sorted(evals)]}")
    assert evals[ROUNDS] < evals[0] - 0.1
    reports = all_reports(room_url)
    assert all(len(r["losses"]) == H for r in reports
               if r["worker"] != gone[0]["worker"] and r["version"] < ROUNDS)
    # The room's page lists every worker, the one that left with why.
    page = pages[0]
    page.reload()
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    assert page.locator("#workers tbody tr").count() == WORKERS + 1
    assert "left" in page.inner_text(f"#workers tr[data-worker='{gone[0]['worker']}']")
    chart = page.locator("[data-chart='global eval loss']")
    outliers = sum(len(e["outliers"]) for e in room["evals"])
    assert chart.get_attribute("data-versions") == str(ROUNDS + 1)
    assert chart.get_attribute("data-outliers") == str(outliers)
    assert chart.get_attribute("data-points") == str(ROUNDS + 1 + outliers)   # one x each
    # /compare draws its global eval loss at the tokens it took, in one browser's steps.
    page.goto(f"{live_server}/compare?ids={run['id']}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    assert page.get_attribute("[data-chart='eval loss']", "data-points") == str(ROUNDS + 1)


def andrea_train(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "andrea", "train", *args, "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_one_f32_worker_trains_its_round_exactly_as_a_plain_run(live_server):
    """Round 0's inner steps are the Trainer's own steps on the plain run's batches (slot 0 of
    round 0 draws batch index i at step i) with the same schedule: the same losses, up to the
    init's last bits (the room's version 0 is the server's numpy port of the GPU's init, whose
    log and cos differ from the GPU's by an ulp or so: 4e-7 of the first loss measured, 2e-5
    by the 8th step as Adam's sign-like steps amplify it, where another batch moves a loss by
    1e-2)."""
    common = (*cli_args(), "--steps", "8", "--batch-size", "2", "--seed", "9",
              "--server", live_server)
    plain = andrea_train(*common, "--eval-every", "0", "--sample-every", "0")
    room = andrea_train(*common, "--room", json.dumps({"inner_steps": 8, "codec": "f32"}))
    assert room["ok"] and room["version"] == 1
    want = [m["loss"] for m in httpx.get(
        f"{live_server}/api/runs/{plain['run_id']}/metrics").json()]
    reports = all_reports(f"{live_server}/api/runs/{room['run_id']}/room")
    got = next(r["losses"] for r in reports if r["version"] == 0)
    assert len(want) == 8 and len(got) == 8
    assert max(abs(g / w - 1) for g, w in zip(got, want)) < 1e-4, (got, want)


def test_the_new_run_form_makes_a_room_run_and_its_page_offers_to_join(page, live_server):
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.select_option("#preset", "tiny")
    page.check("#room-run")
    # An int8 room's worker holds a version and three int8 bodies on the GPU: the estimate
    # counts them (tiny: 4 + 3 x 1.016 bytes a parameter, 0.9 MiB; overlapped, 4 more: 1.5
    # MiB), and an f16 room's does not.
    row = "#memory tr:has-text('room worker')"
    page.wait_for_selector(row)
    assert page.inner_text(row).endswith("0.9 MiB")
    page.check("input[name='room.overlap']")
    page.wait_for_selector(f"{row}:has-text('1.5 MiB')")
    page.uncheck("input[name='room.overlap']")
    page.fill("input[name='room.inner_steps']", "5")
    page.select_option("select[name='room.codec']", "f16")
    page.wait_for_selector(row, state="detached")
    page.wait_for_function("!document.getElementById('start').disabled")
    page.click("#start")
    page.wait_for_url("**/runs/*")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    run_id = page.url.rsplit("/", 1)[1]
    assert "#" not in page.url                        # the join token left the address bar
    config = httpx.get(f"{live_server}/api/runs/{run_id}").json()["config"]
    assert config["room"]["inner_steps"] == 5 and config["room"]["codec"] == "f16"
    assert page.is_visible("#join") and page.is_visible("#copy-join")
    assert "training version 0" in page.inner_text("#status")    # the server made version 0


def test_the_owner_removes_a_worker_from_the_rooms_page(browser, live_server):
    """The run's owner (here this machine's local user: no token) removes a training worker
    with its row's Remove button: the worker shows left, removed by the run's owner, and its
    tab stops at its next request to the room."""
    run = httpx.post(f"{live_server}/api/runs", json={
        **SMALL, "steps": 400, "batch_size": 2, "seed": 5,
        "room": {"inner_steps": 4, "codec": "f16", "round_deadline_s": 600}}).json()
    room_url = f"{live_server}/api/runs/{run['id']}/room"
    worker = browser.new_context().new_page()
    worker.add_init_script("window.andreaAutoJoin = true;")
    worker.goto(f"{live_server}/runs/{run['id']}#join={run['room']['join_token']}")
    worker.wait_for_function("document.body.dataset.workerStatus === 'running'", timeout=TIMEOUT)
    owner = browser.new_context().new_page()
    owner.goto(f"{live_server}/runs/{run['id']}")
    owner.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    row = "#workers tr[data-worker='0']"
    dialogs = []

    def accept(dialog):
        dialogs.append(dialog.message)
        dialog.accept()
    owner.once("dialog", accept)
    owner.click(f"{row} button.remove")
    owner.wait_for_function(
        f"document.querySelector(\"{row}\")?.innerText.includes(\"removed by the run's owner\")",
        timeout=PAGE_WAIT_MS)
    assert "Remove worker 0" in dialogs[0]
    assert owner.locator(f"{row} button.remove").count() == 0      # only active workers have one
    assert not owner.is_visible("#error")
    w = wait_room(room_url, lambda r: r["workers"][0]["left"] is not None)["workers"][0]
    assert w["why"] == "removed by the run's owner"
    worker.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    assert worker.evaluate("document.body.dataset.done") == "failed"


def test_a_room_rides_out_a_server_restart_with_nothing_lost(browser, tmp_path):
    """The server goes away mid-run and comes back on the same data dir: the workers wait for it
    (batches, pseudo-gradients, reports and the next version are retried), the open round's
    pseudo-gradients are still there, and every round closes with both workers in it."""
    from andrea.cli.launch import free_port, start_server, stop_server

    port = free_port()
    server, url = start_server(tmp_path / "data", port)
    try:
        run = httpx.post(f"{url}/api/runs", json={
            **SMALL, "steps": 18, "batch_size": 2, "seed": 3,
            "room": {"inner_steps": 6, "codec": "f16", "round_deadline_s": 600,
                     "workers_per_address": 2}}).json()
        link = f"{url}/runs/{run['id']}#join={run['room']['join_token']}"
        pages = []
        for _ in range(2):
            page = browser.new_context().new_page()
            page.add_init_script("window.andreaAutoJoin = true;")
            page.goto(link)
            pages.append(page)
        # Both train (each has sent a pseudo-gradient): then the server goes.
        wait_room(f"{url}/api/runs/{run['id']}/room",
                  lambda r: len(r["workers"]) == 2 and all(w["deltas"] for w in r["workers"]))
        at = httpx.get(f"{url}/api/runs/{run['id']}/room").json()["version"]
        stop_server(server)
        server, _ = start_server(tmp_path / "data", port)
        for page in pages:
            page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
            assert page.evaluate("document.body.dataset.done") == "finished", \
                page.inner_text("#error")
        room = httpx.get(f"{url}/api/runs/{run['id']}/room").json()
        assert room["finished"] and room["version"] == 3
        # The round open across the restart, and every one after, closed with both workers.
        assert [len(c["workers"]) for c in room["closed"] if c["round"] >= at] == [2] * (3 - at)
        assert not any(c["refused"] or c["stale"] for c in room["closed"])
    finally:
        stop_server(server)
