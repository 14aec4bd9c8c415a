"""Makes docs/spike-anatomy.png, the README's picture of a spike's anatomy: the planted-outlier
run of the e2e test (e2e/planted_corpus.py: `tiny` on two user sources, one hiding a paragraph
of random Greek) trained by `andrea train`, then its run page in headless Chromium
(SwiftShader) with the heatmap and the outlier's spike opened.
Usage (from the checkout, in its .venv): python -m docs.screenshot_spikes"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from andrea.cli.browser_flags import QUIET, SWIFTSHADER
from andrea.cli.chromium import CHROMIUM
from andrea.cli.launch import served
from e2e.planted_corpus import TRAIN_ARGS, greek_share, write_planted_corpus

OUT = Path(__file__).with_name("spike-anatomy.png")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        args = write_planted_corpus(Path(tmp) / "corpus")
        with served(Path(tmp) / "data", args=args, timeout=300) as url:
            r = subprocess.run([sys.executable, "-m", "andrea", "train", *TRAIN_ARGS,
                                "--server", url, "--json"], capture_output=True, text=True)
            result = json.loads(r.stdout)
            assert result["ok"], result
            run_id = result["run_id"]
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM,
                                            args=["--headless=new", *QUIET, *SWIFTSHADER])
                # Tall enough for the page down to the spike list: the clip is in the viewport.
                page = browser.new_page(viewport={"width": 1280, "height": 3200})
                spikes = page.request.get(f"{url}/api/runs/{run_id}/spikes").json()["spikes"]
                step = next(s["step"] for s in spikes if s["rows"]
                            and greek_share(s["rows"][0].get("text", "")) > 0.5)
                page.goto(f"{url}/runs/{run_id}")
                page.wait_for_selector("#heatmap-card:not([hidden])", timeout=60_000)
                item = page.locator(f"#spikes details.spike[data-step='{step}']")
                item.locator("summary").click()
                page.wait_for_timeout(1500)
                top = page.locator("#heatmap-card").bounding_box()
                end = item.bounding_box()
                page.screenshot(path=str(OUT), clip={
                    "x": 0, "y": top["y"] - 10, "width": 1280,
                    "height": end["y"] + end["height"] - top["y"] + 20})
                browser.close()
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
