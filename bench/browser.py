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


def andrea_train(url: str, flags: list[str], gpu: bool = False) -> dict:
    """`andrea train --json` on the server at `url` with `flags` (--preset, --steps, ...): a run
    trained by the run page in headless Chromium, on the GPU with `gpu`; -> {id, seconds}.
    A failed run stops the benchmark with its error and the command's last output."""
    import json
    import subprocess
    import sys
    import time

    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "andrea", "train", *(["--gpu"] if gpu else []), "--server", url,
           *flags, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    result = json.loads(r.stdout)
    if not result.get("ok"):
        raise SystemExit(f"{' '.join(cmd)}: {result.get('error')}\n{r.stderr[-2000:]}")
    return {"id": result["run_id"], "seconds": time.monotonic() - t0}
