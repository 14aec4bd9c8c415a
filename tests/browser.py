"""A real uvicorn server and Debian's Chromium (SwiftShader WebGPU) for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ANDREA_CHROMIUM", "/usr/bin/chromium")

# DESIGN.md section 9: WebGPU on SwiftShader in headless Chromium, no network chatter.
QUIET_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
WEBGPU_FLAGS = ["--enable-unsafe-webgpu", "--enable-unsafe-swiftshader",
                "--use-webgpu-adapter=swiftshader"]
if os.environ.get("ANDREA_GPU_BROWSER"):
    # On a machine with a real GPU: let Chrome pick it through Vulkan instead of SwiftShader.
    WEBGPU_FLAGS = ["--enable-unsafe-webgpu", "--enable-features=Vulkan"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not become healthy in {timeout}s")


@pytest.fixture(scope="session")
def server_data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("andrea-data")


@pytest.fixture(scope="session")
def live_server(server_data_dir) -> str:
    """`andrea serve` in a subprocess on a free loopback port; yields its base URL."""
    port = _free_port()
    log = open(server_data_dir / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "serve", "--port", str(port),
         "--data-dir", str(server_data_dir)],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": CHROMIUM,
            "args": ["--headless=new", *QUIET_FLAGS, *WEBGPU_FLAGS]}


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
