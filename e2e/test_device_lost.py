"""A lost GPU device does not lose the run. The browser's GPU process is crashed mid-run (DevTools'
Browser.crashGpuProcess: what a driver reset or chrome://gpucrash does), on SwiftShader here and
on the GPU with ANDREA_GPU_BROWSER=1: the page says so, keeps every committed record, stops the
run resumably, and its resume button continues it from the last checkpoint to the end, the
steps recomputed after the checkpoint equal to the ones recorded before the loss; `andrea
train` resumes by itself. Also: `andrea train --gpu` never trains on a software adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from andrea.web.auth import token_init_script
from tests.browser import CHROMIUM, GPU_BROWSER, browser_args
from tests.small_model import SMALL, cli_args

# The crash comes after step CRASH_AFTER and before the run's end, however fast the adapter (a
# GPU, or SwiftShader on an idle machine, once trained all 50 steps before it landed): the page
# is held there by gates, its batch requests left unanswered until the test opens them.
STEPS, EVERY, CRASH_AFTER = 50, 10, 22
FIELDS = ("loss", "grad_norm", "clip_scale", "lr")
HTTP_S = 60   # not httpx's 5 s: a server's first run creation once took 17-27 s on a busy machine


def config(seed: int) -> dict:
    return {**SMALL, "optimizer": "adamw", "steps": STEPS, "batch_size": 2,
            "seed": seed, "checkpoint_every": EVERY, "eval_every": 20, "sample_every": 0}


def run_info(url: str, run_id: str) -> dict:
    return httpx.get(f"{url}/api/runs/{run_id}", timeout=HTTP_S).json()


def metrics(url: str, run_id: str) -> list[dict]:
    return httpx.get(f"{url}/api/runs/{run_id}/metrics", timeout=HTTP_S).json()


class BatchGate:
    """Holds the page's request for the batch of 0-based step `index` (the batch of step
    index + 1) until open(): the page trains up to step `index` and waits there. Playwright's
    sync API runs route handlers only inside its own calls: wait through the page (wait_until),
    not with time.sleep."""

    def __init__(self, page, run_id: str, index: int):
        self.held, self.opened = [], False
        page.route(f"**/api/runs/{run_id}/batches/{index}", self._route)

    def _route(self, route):
        if self.opened:
            route.continue_()
        else:
            self.held.append(route)

    def open(self):
        self.opened = True
        for route in self.held:
            route.continue_()
        self.held.clear()


def wait_until(page, until, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the run never got there"
        page.wait_for_timeout(100)


def test_a_lost_device_stops_the_run_resumably_and_the_page_resumes_it(playwright, live_server):
    run = httpx.post(f"{live_server}/api/runs", json=config(seed=41), timeout=HTTP_S).json()
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=browser_args())
    try:
        page = browser.new_context().new_page()
        # Step 20's batch waits for the step-10 checkpoint to be stored, so that step 20's is
        # taken at step 20 (one that comes due while another uploads is put off to the first step
        # after it); step CRASH_AFTER + 1's waits for the crash.
        after_checkpoint = BatchGate(page, run["id"], 2 * EVERY - 1)
        after_crash = BatchGate(page, run["id"], CRASH_AFTER)
        page.add_init_script(token_init_script(run["id"], run["token"]))
        page.goto(f"{live_server}/runs/{run['id']}")
        page.wait_for_function(f"Number(document.body.dataset.checkpoint || 0) >= {EVERY}",
                               timeout=600_000, polling=50)
        after_checkpoint.open()
        # Every step up to the gate committed, and step 20's checkpoint stored.
        wait_until(page, lambda: (i := run_info(live_server, run["id"])).get("last_step") ==
                   CRASH_AFTER and i["checkpoint"]["last_step"] == 2 * EVERY)
        browser.new_browser_cdp_session().send("Browser.crashGpuProcess")
        page.wait_for_function("Boolean(window.andreaTrainer?.lost)", timeout=120_000)
        after_crash.open()   # its batch now meets a lost device: no step after CRASH_AFTER lands
        page.wait_for_function("document.body.dataset.done", timeout=120_000)

        assert page.evaluate("document.body.dataset.done") == "stopped"
        lost = page.evaluate("document.body.dataset.deviceLost")
        assert lost.startswith("GPU device lost"), lost
        assert page.locator("#error").is_visible()
        assert f"are kept; resume to continue from the checkpoint of step {2 * EVERY}." in \
            page.inner_text("#error")
        info = run_info(live_server, run["id"])
        assert info["status"] == "stopped" and info["message"].startswith("GPU device lost")
        before = metrics(live_server, run["id"])
        kept = len(before)
        assert kept == CRASH_AFTER   # every step read back before the loss, committed
        assert [m["step"] for m in before] == list(range(1, kept + 1))
        assert info["checkpoint"]["last_step"] == 2 * EVERY

        with page.expect_navigation():   # the tab resumes it on a fresh device
            page.locator("#resume-run").click()
        page.wait_for_function("document.body.dataset.done", timeout=600_000)
        assert page.evaluate("document.body.dataset.done") == "finished", \
            page.inner_text("#error")
    finally:
        browser.close()
    after = metrics(live_server, run["id"])
    assert [m["step"] for m in after] == list(range(1, STEPS + 1))   # every step once
    # The steps before the loss, those recomputed after the checkpoint included, are unchanged.
    for x, y in zip(before, after[:kept]):
        assert {k: x[k] for k in FIELDS} == {k: y[k] for k in FIELDS}, x["step"]
    assert run_info(live_server, run["id"])["status"] == "finished"


# `andrea train` whose browser's GPU process crashes once, after the step-EVERY checkpoint. Every
# context the command opens holds the batch of step HOLD + 1 (a gate) until the page has seen the
# loss, so the crash comes mid-run whatever the adapter's speed; the resumed page's passes.
HOLD = EVERY + 2
CRASHING_TRAIN = """
import sys
from andrea.cli import chromium
from andrea.cli import main as cli
held, crashed, opened = [], [], []
def gate(route):
    if opened:
        route.continue_()
    else:
        held.append(route)
launch = chromium.Chromium.launch
def gated_launch(self):
    launch(self)
    new_context = self._browser.new_context
    def gated_context(*args, **kwargs):
        context = new_context(*args, **kwargs)
        context.route("**/api/runs/*/batches/%d", gate)
        return context
    self._browser.new_context = gated_context
chromium.Chromium.launch = gated_launch
watch = chromium.Chromium._watch
def crashing_watch(self, page, errors, timeout, tick, *rest):
    def tick_then_crash():
        if not crashed and page.evaluate("Number(document.body.dataset.checkpoint || 0)") >= %d:
            crashed.append(True)
            self.crash_gpu_process()
        elif crashed and not opened and page.evaluate("Boolean(window.andreaTrainer?.lost)"):
            opened.append(True)
            for route in held:
                route.continue_()
        return tick()
    return watch(self, page, errors, timeout, tick_then_crash, *rest)
chromium.Chromium._watch = crashing_watch
sys.exit(cli.main(sys.argv[1:]))
""" % (HOLD, EVERY)


def test_andrea_train_resumes_after_a_lost_device_by_itself(live_server):
    args = ["train", "--server", live_server, *cli_args(), "--steps", str(STEPS),
            "--batch-size", "2", "--checkpoint-every", str(EVERY), "--sample-every", "0",
            "--seed", "42", "--json", *(["--gpu"] if GPU_BROWSER else [])]
    r = subprocess.run([sys.executable, "-c", CRASHING_TRAIN, *args], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    assert result["ok"] and result["status"] == "finished", result
    assert result["device_losses"] == 1
    assert "GPU device lost" in r.stderr and "resuming from the checkpoint of step" in r.stderr
    assert [m["step"] for m in metrics(live_server, result["run_id"])] == \
        list(range(1, STEPS + 1))


# A browser whose GPU is off: WebGPU falls back to SwiftShader, whatever other flags it gets.
SOFTWARE_ONLY = """#!/bin/sh
exec "$ANDREA_REAL_CHROMIUM" "$@" --disable-gpu
"""


def test_andrea_train_gpu_refuses_a_software_adapter_before_creating_a_run(live_server,
                                                                           tmp_path):
    wrapper = tmp_path / "chromium-software-only"
    wrapper.write_text(SOFTWARE_ONLY)
    wrapper.chmod(0o755)
    before = httpx.get(f"{live_server}/api/runs", timeout=HTTP_S).headers["x-total-count"]
    r = subprocess.run([sys.executable, "-m", "andrea", "train", "--gpu", "--preset", "tiny",
                        "--steps", "2", "--server", live_server, "--json"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ANDREA_CHROMIUM": str(wrapper),
                            "ANDREA_REAL_CHROMIUM": CHROMIUM})
    assert r.returncode == 1, r.stdout + r.stderr
    result = json.loads(r.stdout)
    err = result["error"]
    if GPU_BROWSER:   # a browser without SwiftShader (the packed headless shell) offers none
        assert err.startswith(("no WebGPU adapter: the browser at ANDREA_CHROMIUM=",
                               "no GPU adapter: the browser at ANDREA_CHROMIUM=")), result
    else:             # Debian's Chromium falls back to SwiftShader, and that is refused
        assert err.startswith("no GPU adapter: the browser at ANDREA_CHROMIUM="), result
        assert "offered only google swiftshader, a software one" in err
    assert result["run_id"] is None
    assert r.stderr.strip() == f"andrea train: {result['error']}"
    assert httpx.get(f"{live_server}/api/runs", timeout=HTTP_S).headers["x-total-count"] == before
