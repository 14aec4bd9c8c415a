"""A real uvicorn server and Debian's Chromium (SwiftShader WebGPU) for end-to-end tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The same Chromium and flags as `andrea train` (server/cli/chromium.py, browser_flags.py).
from andrea.cli.browser_flags import QUIET, webgpu_args
from andrea.cli.chromium import CHROMIUM
from tests.servers import serve

QUIET_FLAGS = QUIET
# ANDREA_GPU_BROWSER=1: on a machine with a real GPU, the flags of `andrea train --gpu`.
GPU_BROWSER = bool(os.environ.get("ANDREA_GPU_BROWSER"))
# How long a page may take to get ready or answer before a test calls it hung (ms): a guard,
# not a measure, generous for SwiftShader on a machine running two suites at once.
PAGE_WAIT_MS = 180_000


def browser_args() -> list[str]:
    """The flags of `andrea train`, ANDREA_CHROMIUM_ARGS included (read when called: conftest.py
    adds the tests' Dawn toggles to it at configure time)."""
    return webgpu_args(GPU_BROWSER)


@pytest.fixture(scope="session")
def server_data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("andrea-data")


@pytest.fixture(scope="session")
def live_server(server_data_dir) -> str:
    """`andrea serve` in a subprocess on a free loopback port; yields its base URL. One server
    for every test file of an xdist worker (the browser's, and the API's that only make and
    read runs of their own: tests/api/test_telemetry*.py, test_generate.py, ...), so the
    per-client burst of new runs (a workshop's bound: tests/api/test_web_quotas.py holds it) is
    lifted here: how many runs a worker's files create in a row depends on which files it was
    handed."""
    with serve(server_data_dir, run_burst=100_000) as server:
        yield server.url


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": CHROMIUM,
            "args": browser_args()}


@pytest.fixture
def posted_runs(page):
    """The run configs the page POSTs to /api/runs, kept from the server (answered 422: nothing
    is created), for form tests."""
    posted: list[dict] = []

    def hold(route):
        if route.request.method != "POST":
            return route.continue_()
        posted.append(route.request.post_data_json)
        return route.fulfill(status=422, json={"detail": "held by the test"})

    page.route("**/api/runs", hold)
    return posted


@pytest.fixture
def page_errors(page):
    """Console errors and uncaught exceptions of the page, to assert there are none."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


@pytest.fixture(scope="session")
def lab_session(browser, live_server):
    """One /lab page for the whole session (WebGPU device creation and shader compiles are slow
    on SwiftShader). Tests call into window.andrea.lab through tests/lab.py helpers."""
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(live_server + "/lab")
    page.wait_for_function("document.body.dataset.lab !== undefined", timeout=120_000)
    assert page.evaluate("document.body.dataset.lab") == "ready", page.inner_text("body")
    page.set_default_timeout(600_000)
    yield page
    assert not [e for e in errors if "WebGPU" in e or "GPU" in e], errors
    context.close()
