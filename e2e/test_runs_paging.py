"""The runs page shows the first page of runs (GET /api/runs: 100) and a "Show older runs"
button that loads the next one by the list's Link header, until none is left."""

from __future__ import annotations

import httpx

from andrea.cli.launch import start_server, stop_server

RUNS = 105      # a page (100) and a few more


def test_show_older_runs_loads_the_next_page(browser, tmp_path):
    proc, url = start_server(tmp_path / "data", env={"ANDREA_RUN_BURST": str(RUNS)})
    try:
        with httpx.Client(timeout=120) as http:     # the corpus is read on the first one
            made = [http.post(f"{url}/api/runs", json={"preset": "tiny", "steps": 10})
                    .raise_for_status().json()["id"] for _ in range(RUNS)]
        ctx = browser.new_context()
        page = ctx.new_page()
        page.goto(f"{url}/runs")
        page.wait_for_function("document.body.dataset.ready === '1'")
        rows = page.locator("#runs tbody tr[data-run-id]")
        assert rows.count() == 100
        assert page.inner_text("#count") == f"100 of 100 runs ({RUNS} stored)"
        older = page.locator("#older")
        assert older.is_visible() and older.inner_text() == "Show older runs"
        older.click()
        page.wait_for_function(f"document.querySelectorAll('#runs tbody tr[data-run-id]')"
                               f".length === {RUNS}")
        shown = [rows.nth(i).get_attribute("data-run-id") for i in range(RUNS)]
        assert shown == made[::-1]          # newest first (the list's default sort)
        assert older.is_hidden()            # nothing older left
        ctx.close()
    finally:
        stop_server(proc)
