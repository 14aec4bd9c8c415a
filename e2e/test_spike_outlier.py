"""A planted outlier, found end to end: a user corpus of two sources, one of which hides a
paragraph of random Greek letters in its plain sentences, trained on `tiny` through the app's
own page in Chromium (`andrea train`); the gradient spike the outlier causes is listed by
GET /api/runs/{id}/spikes and on the run page with that row's source and its text."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from andrea.cli.launch import start_server, stop_server
from e2e.planted_corpus import TRAIN_ARGS, greek_share, write_planted_corpus


@pytest.fixture(scope="module")
def outlier_server(tmp_path_factory):
    """`andrea serve --only-corpus` on `plain` (sentences) and `planted` (sentences with ~600
    characters of random Greek a third of the way in: inside the training split)."""
    root = tmp_path_factory.mktemp("outlier")
    proc, url = start_server(root / "data", timeout=300,
                             args=write_planted_corpus(root / "corpus"))
    try:
        yield url
    finally:
        stop_server(proc)


def test_a_planted_outlier_is_named_by_its_spike(outlier_server, page, page_errors):
    r = subprocess.run(
        [sys.executable, "-m", "andrea", "train", *TRAIN_ARGS, "--server", outlier_server,
         "--json"],
        capture_output=True, text=True, timeout=900)
    result = json.loads(r.stdout)
    assert result["ok"], r.stderr
    run_id = result["run_id"]
    with urllib.request.urlopen(f"{outlier_server}/api/runs/{run_id}/spikes", timeout=60) as f:
        spikes = json.load(f)["spikes"]
    for s in spikes:
        rows = [(x.get("source"), x.get("text", "")[:30]) for x in s["rows"]]
        print(s["step"], s["reasons"], rows)
    planted = [s for s in spikes if s["rows"] and s["rows"][0].get("source") == "planted"
               and greek_share(s["rows"][0]["text"]) > 0.5]
    assert planted, f"no spike names the planted row; spikes: {[s['step'] for s in spikes]}"
    assert "spike at step" in r.stderr                   # andrea train printed them as they came
    s = planted[0]
    page.goto(f"{outlier_server}/runs/{run_id}")
    item = page.locator(f"#spikes details.spike[data-step='{s['step']}']")
    item.locator("summary").click()
    assert "planted" in item.inner_text(timeout=30_000)
    assert item.locator("pre").first.text_content() == s["rows"][0]["text"]
    assert not page_errors
