"""Makes docs/room-page.png, the README's picture of a room run mid-run: a `tiny` room of
WORKERS tabs (SwiftShader) trained through its join link beside one tab alone (started by the
room page's own button), and the room's page at 1280 px in headless Chromium once half its
rounds are done. Usage (from the checkout, in its .venv):
python docs/screenshot_room.py [ROUNDS]"""

import sys
import tempfile
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from andrea.cli.browser_flags import QUIET, SWIFTSHADER
from andrea.cli.chromium import CHROMIUM
from andrea.cli.launch import served

OUT = Path(__file__).with_name("room-page.png")
WORKERS, H = 3, 10


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data, served(Path(data)) as url:
        run = httpx.post(f"{url}/api/runs", json={
            "preset": "tiny", "steps": H * rounds, "batch_size": 4, "lr": 0.004,
            "room": {"inner_steps": H, "codec": "int8", "workers_per_address": WORKERS}}).json()
        link = f"{url}/runs/{run['id']}#join={run['room']['join_token']}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM,
                                        args=["--headless=new", *QUIET, *SWIFTSHADER])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{url}/runs/{run['id']}")
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
            with page.context.expect_page():       # the lone tab trains in the tab it opens
                page.click("#train-alone")
            workers = []
            for _ in range(WORKERS):
                worker = browser.new_context().new_page()
                worker.add_init_script("window.andreaAutoJoin = true;")
                worker.goto(link)
                workers.append(worker)
            room = f"{url}/api/runs/{run['id']}/room"
            # (polled from here: a predicate that returns a promise is truthy at once)
            while httpx.get(room).json()["version"] < rounds // 2:
                page.wait_for_timeout(1000)
            page.wait_for_timeout(2500)              # (the page's next look at the room)
            page.screenshot(path=str(OUT), full_page=True)
            browser.close()
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
