"""A checkpoint of `tiny` as the run page takes it in headless Chromium here (SwiftShader: CPU
timings): trains a short run with a checkpoint every 10 steps and prints what the page shows
(size, read-back latency, upload time) beside the step time. Read-back latency includes the
steps still queued ahead of the copy: on a CPU adapter it is mostly waiting, not cost.
    python -m bench.bench_checkpoint_browser [--steps 40] [--batch 4]"""

import argparse

import httpx
from playwright.sync_api import sync_playwright

from andrea.web.auth import token_init_script
from bench.browser import CHROMIUM, browser_args, served


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    with served() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=browser_args())
        for optimizer in ("adamw", "adamw_8bit"):
            run = httpx.post(f"{url}/api/runs", json={
                "preset": "tiny", "optimizer": optimizer, "steps": args.steps,
                "batch_size": args.batch, "checkpoint_every": 10, "sample_every": 0}).json()
            page = browser.new_page()
            page.add_init_script(token_init_script(run["id"], run["token"]))
            page.goto(f"{url}/runs/{run['id']}")
            page.wait_for_function("document.body.dataset.done", timeout=600_000)
            checkpoint = page.inner_text("[data-stat=checkpoint]")
            step = page.inner_text('[data-stat="step time"]')
            print(f"{optimizer:10} {checkpoint}; {step}", flush=True)
            page.close()
        browser.close()


if __name__ == "__main__":
    main()
