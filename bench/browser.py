"""A live `andrea serve` and headless Chromium (SwiftShader WebGPU) for benchmarks and the CLI."""

from __future__ import annotations

import contextlib

from andrea.cli.launch import served  # noqa: F401  (bench scripts import it from here)
from tests.browser import CHROMIUM, browser_args


@contextlib.contextmanager
def lab_page(url: str):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=browser_args())
        page = browser.new_page()
        page.set_default_timeout(600_000)
        page.goto(url + "/lab")
        page.wait_for_function("document.body.dataset.lab !== undefined")
        assert page.evaluate("document.body.dataset.lab") == "ready"
        yield page
        browser.close()
