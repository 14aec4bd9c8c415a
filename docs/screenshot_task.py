"""Makes docs/task-page.png, the README's picture of a toy task run: `tiny` reversing 4 digits for
STEPS steps (as e2e/test_toy_task.py trains it) by `andrea train` on a throwaway data dir, then
its run page at 1280 px in headless Chromium (SwiftShader) with the prompt box's answer and the
attention maps of a problem, and docs/inside.png: the page's "Inside the model" card.
Usage (from the checkout, in its .venv): python docs/screenshot_task.py [STEPS]"""

import sys
from pathlib import Path

from screenshot import trained_run_page  # (docs/, this script's folder, is on sys.path)

PAGE = Path(__file__).with_name("task-page.png")
INSIDE = Path(__file__).with_name("inside.png")
PROBLEM = "1234>4321"


def main(steps: int) -> None:
    with trained_run_page(steps, ["--task", "reverse", "--task-digits", "4", "--batch-size",
                                  "32", "--eval-every", "25", "--sample-every", "100",
                                  "--seed", "1"]) as page:
        page.wait_for_function("!document.getElementById('prompt-card').hidden")
        page.click("#prompt-go")
        page.wait_for_function("document.body.dataset.prompt === 'done'", timeout=60_000)
        page.click("#attention-details summary")
        page.fill("#attention-text", PROBLEM)
        page.click("#attention-go")
        page.wait_for_function("document.body.dataset.attention === 'done'", timeout=60_000)
        page.wait_for_function("window.andreaInside?.hists.every((h) => h.box.dataset.step)")
        page.wait_for_timeout(1000)
        page.locator("#inside-card").screenshot(path=str(INSIDE))
        # The charts (loss and exact match first), then the prompt box and the maps.
        page.evaluate("""() => { for (const id of ['heatmap-card', 'inside-card',
            'source-charts', 'spikes-card']) document.getElementById(id).hidden = true; }""")
        page.screenshot(path=str(PAGE), full_page=True, clip={
            "x": 0, "y": 0, "width": 1280, "height": page.evaluate(
                "document.getElementById('attention-card').getBoundingClientRect().bottom"
                " + window.scrollY")})
    for out in (PAGE, INSIDE):
        print(f"wrote {out} ({out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
