"""Runs outlive their tab: a run whose browser dies after step 17 resumes from its step-16
checkpoint in a new browser (and through `andrea train --resume`) and ends bit for bit where an
uninterrupted run with the same config ends: every step's loss, grad norm and clip scale, and the
exported model.safetensors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from andrea.web.auth import token_init_script
from tests.browser import CHROMIUM, QUIET_FLAGS, browser_args
from tests.small_model import SMALL

# The browser is killed once step KILL_AFTER and the step-16 checkpoint are committed. Its run
# must still be training then, however fast the adapter: the page is held at a step past it (its
# batch request left unanswered), not raced (a loaded machine once saw a run finish first).
STEPS, KILL_AFTER, EVERY = 40, 17, 8
FIELDS = ("loss", "grad_norm", "clip_scale", "lr")


def config(optimizer: str, seed: int, data_mode: str = "uniform", f16: bool = False,
           every: int = EVERY) -> dict:
    return {**SMALL, "optimizer": optimizer, "steps": STEPS, "batch_size": 2,
            "seed": seed, "checkpoint_every": every, "eval_every": 2 * EVERY, "sample_every": 0,
            "data_mode": data_mode, "f16_mirror": f16}


def killed_config(optimizer: str, seed: int, **kw) -> dict:
    """config() of a run killed after step KILL_AFTER: its one checkpoint before that is step
    16's. (With one at 8 too, an upload of 8 still going at step 16 puts the next off to the
    first step after it, which a page held at step 18 may never reach.)"""
    return config(optimizer, seed, every=2 * EVERY, **kw)


def create(live_server: str, cfg: dict) -> dict:
    r = httpx.post(f"{live_server}/api/runs", json=cfg)
    assert r.status_code == 201, r.text
    return r.json()


def train_in_page(browser, live_server: str, run_id: str, token: str, until=None,
                  hold_at: int | None = None):
    """Opens the run page with the token (as the start page leaves it) and waits until the run
    is done, or until `until(run)` holds; returns the page's context (still open). `hold_at`:
    the batch of that (0-based) step is never answered, so the page trains up to that step and
    then waits there."""
    context = browser.new_context()
    if hold_at is not None:   # a route handler that neither continues nor fulfils: held
        context.route(f"{live_server}/api/runs/{run_id}/batches/{hold_at}", lambda route: None)
    page = context.new_page()
    page.add_init_script(token_init_script(run_id, token))
    page.goto(f"{live_server}/runs/{run_id}")
    if until is None:
        page.wait_for_function("document.body.dataset.done", timeout=600_000)
        assert page.evaluate("document.body.dataset.done") == "finished", \
            page.inner_text("#error")
    else:
        deadline = time.monotonic() + 600
        while not until(httpx.get(f"{live_server}/api/runs/{run_id}").json()):
            assert time.monotonic() < deadline, "the run never got there"
            time.sleep(0.25)
    return context


def metrics(live_server: str, run_id: str) -> list[dict]:
    return httpx.get(f"{live_server}/api/runs/{run_id}/metrics").json()


def assert_same_run(live_server: str, got: str, want: str) -> None:
    a, b = metrics(live_server, got), metrics(live_server, want)
    assert [m["step"] for m in a] == list(range(1, STEPS + 1))   # every step once
    for x, y in zip(a, b):
        assert {k: x.get(k) for k in (*FIELDS, "eval_loss")} == \
               {k: y.get(k) for k in (*FIELDS, "eval_loss")}, x["step"]
    ma = httpx.get(f"{live_server}/api/runs/{got}/model.safetensors").content
    mb = httpx.get(f"{live_server}/api/runs/{want}/model.safetensors").content
    assert ma == mb


@pytest.fixture(scope="module")
def chromium(playwright):
    def launch():
        return playwright.chromium.launch(executable_path=CHROMIUM,
                                          args=browser_args())
    return launch


REFERENCES: dict[tuple[str, str], str] = {}     # (server, config) -> a finished run's id


def reference_run(chromium, live_server: str, cfg: dict) -> str:
    """The id of a run of `cfg` trained to its end in one browser, uninterrupted: trained
    once per config and server, for every test that resumes a run of that config."""
    key = (live_server, json.dumps(cfg, sort_keys=True))
    if key not in REFERENCES:
        ref = create(live_server, cfg)
        browser = chromium()
        train_in_page(browser, live_server, ref["id"], ref["token"]).close()
        browser.close()
        REFERENCES[key] = ref["id"]
    return REFERENCES[key]


def interrupted_run(chromium, live_server: str, cfg: dict) -> str:
    """A run trained past step KILL_AFTER whose browser is then closed without beforeunload."""
    run = create(live_server, cfg)
    browser = chromium()
    train_in_page(browser, live_server, run["id"], run["token"], hold_at=KILL_AFTER + 1,
                  until=lambda r: (r.get("last_step") or 0) >= KILL_AFTER
                  and (r["checkpoint"]["last_step"] or 0) >= 2 * EVERY)
    browser.close()          # the whole browser goes: no beforeunload, no final upload
    info = httpx.get(f"{live_server}/api/runs/{run['id']}").json()
    assert info["checkpoint"]["last_step"] >= 2 * EVERY
    assert info["last_step"] <= KILL_AFTER + 1       # held there: killed mid-run
    return run["id"]


def wait_resumable(live_server: str, run_id: str) -> dict:
    for _ in range(100):   # the server notices the closed trainer socket
        info = httpx.get(f"{live_server}/api/runs/{run_id}").json()
        if info["can_resume"]:
            return info
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never became resumable: {info}")


@pytest.mark.parametrize("optimizer, data_mode, f16", [
    ("adamw", "uniform", False), ("adamw_8bit", "uniform", False),
    ("adamw", "bandit", True)])   # the source bandit's phases, and the f16 weight mirror
def test_resume_in_a_new_browser_is_bit_exact(chromium, live_server, optimizer, data_mode, f16):
    # Seed 15's bandit phases end at steps 28 and 35: both decided after the resume at 16.
    cfg = killed_config(optimizer, seed=15 if data_mode == "bandit" else 11,
                        data_mode=data_mode, f16=f16)
    ref = reference_run(chromium, live_server, cfg)

    run_id = interrupted_run(chromium, live_server, cfg)
    wait_resumable(live_server, run_id)
    # A new browser opens the run page and presses "Resume from checkpoint".
    browser = chromium()
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{live_server}/runs/{run_id}")
    page.wait_for_selector("#resume-run:not([hidden])")
    page.click("#resume-run")
    # (The page reloads itself with the new token: no body for a moment.)
    page.wait_for_function("document.body?.dataset.done", timeout=600_000)
    assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("#error")
    browser.close()
    assert_same_run(live_server, run_id, ref)
    assert httpx.get(f"{live_server}/api/runs/{run_id}").json()["status"] == "finished"
    if data_mode == "bandit":   # the phases decided, not only the losses, are the same
        phases = [httpx.get(f"{live_server}/api/runs/{r}/data").json()["phases"]
                  for r in (run_id, ref)]
        assert len(phases[0]) >= 3 and phases[0] == phases[1], phases


def test_resume_from_the_command_line_is_bit_exact(chromium, live_server):
    cfg = killed_config("adamw", seed=11)     # the browser test's: its reference run serves
    ref = reference_run(chromium, live_server, cfg)

    run_id = interrupted_run(chromium, live_server, cfg)
    wait_resumable(live_server, run_id)
    r = subprocess.run([sys.executable, "-m", "andrea", "train", "--resume", run_id,
                        "--server", live_server, "--json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    assert result["ok"] and result["run_id"] == run_id and result["steps"] == STEPS
    assert_same_run(live_server, run_id, ref)


def test_the_old_tab_is_refused_after_a_resume(chromium, live_server):
    cfg = config("adamw", seed=13)
    run = create(live_server, cfg)
    browser = chromium()
    train_in_page(browser, live_server, run["id"], run["token"], hold_at=EVERY + 2,
                  until=lambda r: (r["checkpoint"]["last_step"] or 0) >= EVERY)
    browser.close()
    wait_resumable(live_server, run["id"])
    assert httpx.post(f"{live_server}/api/runs/{run['id']}/resume").status_code == 200
    # The old tab's token comes back (a reload of the old page): refused, with the reason shown.
    browser = chromium()
    context = browser.new_context()
    page = context.new_page()
    page.add_init_script(token_init_script(run["id"], run["token"]))
    page.goto(f"{live_server}/runs/{run['id']}")
    page.wait_for_function("document.getElementById('error').hidden === false",
                           timeout=300_000)
    assert "resumed elsewhere" in page.inner_text("#error")
    # ... and ends (what `andrea train` waits for) rather than waiting on its socket forever.
    page.wait_for_function("document.body.dataset.done", timeout=120_000)
    assert page.evaluate("document.body.dataset.done") == "failed"
    assert "resumed elsewhere" in page.inner_text("#error")
    browser.close()


def test_branch_continues_a_run_as_a_new_run_with_another_lr(chromium, live_server):
    cfg = {**config("adamw", seed=14), "steps": 30}
    parent = create(live_server, cfg)
    browser = chromium()
    train_in_page(browser, live_server, parent["id"], parent["token"], hold_at=EVERY + 2,
                  until=lambda r: (r["checkpoint"]["last_step"] or 0) >= EVERY)
    browser.close()
    r = subprocess.run([sys.executable, "-m", "andrea", "train", "--branch",
                        f"{parent['id']}@{EVERY}", "--lr", "0.001", "--server", live_server,
                        "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    child = json.loads(r.stdout)["run_id"]
    info = httpx.get(f"{live_server}/api/runs/{child}").json()
    assert child != parent["id"] and info["status"] == "finished"
    assert info["config"]["parent"] == {"run": parent["id"], "step": EVERY}
    assert info["config"]["lr"] == 0.001
    got, before = metrics(live_server, child), metrics(live_server, parent["id"])
    assert [m["step"] for m in got] == list(range(1, 31))
    assert got[:EVERY] == before[:EVERY]            # the parent's steps up to the checkpoint
    # then its own learning rate (the parent's schedule peaks at its default 3e-3)
    assert got[EVERY]["lr"] <= 0.001 < before[EVERY - 1]["lr"]


def test_a_resume_link_takes_the_runs_token_to_another_browser(playwright, tmp_path):
    """On a workshop's server (a LAN name: every change needs the run's token), the run page
    of the browser that holds the token offers its resume link; a browser opened from that
    link keeps the token (and drops it from the address bar) and may then rename the run; one
    without it is told why it may not."""
    from websockets.sync.client import connect

    from andrea.cli.launch import start_server, stop_server

    proc, url = start_server(tmp_path / "data", env={"ANDREA_ALLOWED_HOSTS": "workshop.lan"})
    port = url.rsplit(":", 1)[1]
    lan = f"http://workshop.lan:{port}"
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--headless=new", *QUIET_FLAGS, "--host-resolver-rules=MAP workshop.lan 127.0.0.1"])
    try:
        run = create(url, config("adamw", seed=15))
        with connect(url.replace("http", "ws", 1) + f"/ws/runs/{run['id']}") as ws:   # stopped
            ws.send(json.dumps({"type": "hello", "token": run["token"]}))
            assert json.loads(ws.recv(timeout=15))["type"] == "welcome"
            ws.send(json.dumps({"type": "status", "status": "stopped"}))
            ws.send(json.dumps({"type": "ping"}))
            assert json.loads(ws.recv(timeout=15)) == {"type": "pong"}
        owner = browser.new_context().new_page()
        owner.add_init_script(token_init_script(run["id"], run["token"]))
        owner.goto(f"{lan}/runs/{run['id']}")
        owner.wait_for_selector("#copy-link:not([hidden])")
        shown = []      # no clipboard on a plain-http LAN page: the link is shown to copy
        owner.on("dialog", lambda d: (shown.append(d.default_value), d.dismiss()))
        owner.click("#copy-link")
        deadline = time.monotonic() + 10
        while not shown and time.monotonic() < deadline:
            owner.wait_for_timeout(50)
        assert shown == [f"{lan}/runs/{run['id']}#token={run['token']}"]

        page = browser.new_context().new_page()
        page.goto(shown[0])
        page.wait_for_selector("#copy-link:not([hidden])")
        assert page.url == f"{lan}/runs/{run['id']}"             # the token left the bar
        page.fill("#edit-name", "renamed elsewhere")
        page.click("#edit-save")
        page.wait_for_function("document.getElementById('edit-status').textContent === 'Saved.'")
        assert httpx.get(f"{url}/api/runs/{run['id']}").json()["name"] == "renamed elsewhere"

        stranger = browser.new_context().new_page()
        stranger.goto(f"{lan}/runs/{run['id']}")
        stranger.wait_for_selector("#edit-name")
        assert stranger.is_hidden("#copy-link")
        stranger.fill("#edit-name", "pwned")
        stranger.click("#edit-save")
        stranger.wait_for_function(
            "document.getElementById('edit-status').textContent.startsWith('Not saved')")
        assert "Authorization: Bearer" in stranger.inner_text("#edit-status")
        assert httpx.get(f"{url}/api/runs/{run['id']}").json()["name"] == "renamed elsewhere"
    finally:
        browser.close()
        stop_server(proc)
