"""A live `andrea serve` and headless Chromium (SwiftShader WebGPU) for benchmarks and the CLI."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from tests.browser import CHROMIUM, QUIET_FLAGS, WEBGPU_FLAGS


@contextlib.contextmanager
def served(data_dir: str | None = None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data_dir = data_dir or tempfile.mkdtemp(prefix="andrea-bench-")
    proc = subprocess.Popen([sys.executable, "-m", "server", "serve", "--port", str(port),
                             "--data-dir", data_dir], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def lab_page(url: str):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--headless=new", *QUIET_FLAGS, *WEBGPU_FLAGS])
        page = browser.new_page()
        page.set_default_timeout(600_000)
        page.goto(url + "/lab")
        page.wait_for_function("document.body.dataset.lab !== undefined")
        assert page.evaluate("document.body.dataset.lab") == "ready"
        yield page
        browser.close()
