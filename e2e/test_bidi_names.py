"""A run named with a bidi override (U+202E) cannot reorder the runs list in real Chromium: its
name and tags are shown isolated (dir="auto", so unicode-bidi: isolate) and with every bidi
control replaced by U+FFFD (static/js/app/text.js setShown)."""

from __future__ import annotations

import httpx


def test_a_bidi_override_in_a_name_or_tag_is_neutralised_in_the_runs_list(page, live_server):
    run = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny", "steps": 10},
                     timeout=120).raise_for_status().json()
    # A local request: the machine's own user may rename without the token (deps.authorize).
    httpx.patch(f"{live_server}/api/runs/{run['id']}",
                json={"name": "evil \u202egnp.exe", "tags": ["\u2067tag"]}).raise_for_status()
    page.goto(f"{live_server}/runs")
    page.wait_for_function("document.body.dataset.ready === '1'")
    row = page.locator(f'#runs tbody tr[data-run-id="{run["id"]}"]')
    name, tag = row.locator("td.name a"), row.locator("td.name span.tag")
    assert name.text_content() == "evil \ufffdgnp.exe"
    assert tag.text_content() == "\ufffdtag"
    for el in (name, tag):
        assert el.get_attribute("dir") == "auto"
        assert el.evaluate("e => getComputedStyle(e).unicodeBidi") == "isolate"
    # Nothing of the row reads right to left: the override is gone, not merely contained.
    assert "\u202e" not in row.text_content()
    assert row.locator("input[type=checkbox]").get_attribute("aria-label") == \
        "select evil \ufffdgnp.exe"
