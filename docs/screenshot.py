"""Makes docs/run-page.png, the README's picture: a `tiny` run of STEPS steps trained by `andrea
train` on a throwaway data dir, then its run page at 1280 px in headless Chromium (SwiftShader).
Usage (from the checkout, in its .venv): python docs/screenshot.py [STEPS]"""

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from andrea.cli.browser_flags import QUIET, SWIFTSHADER
from andrea.cli.chromium import CHROMIUM
from andrea.cli.launch import served

OUT = Path(__file__).with_name("run-page.png")


@contextlib.contextmanager
def trained_run_page(steps: int, flags: list[str]):
    """A `tiny` run of `steps` steps trained by `andrea train` with `flags` on a throwaway data
    dir, then its run page at 1280 px in headless Chromium, every step charted: the page."""
    with tempfile.TemporaryDirectory() as data, served(Path(data)) as url:
        r = subprocess.run([sys.executable, "-m", "andrea", "train", "--preset", "tiny",
                            "--steps", str(steps), *flags, "--server", url, "--json"],
                           capture_output=True, text=True)
        result = json.loads(r.stdout)
        assert result["ok"], result
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM,
                                        args=["--headless=new", *QUIET, *SWIFTSHADER])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{url}/runs/{result['run_id']}")
            page.wait_for_function("Number(document.getElementById('charts').dataset.steps)"
                                   f" >= {steps}", timeout=60_000)
            yield page
            browser.close()


def main(steps: int) -> None:
    with trained_run_page(steps, ["--eval-every", "10", "--sample-every", "20"]) as page:
        page.wait_for_timeout(1000)
        page.screenshot(path=str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
