"""Mixed precision in the browser (Chromium on SwiftShader here: no f16 subgroup matrices). The
new-run form offers fp32 and shows mixed as unavailable, and a mixed-precision run's page says it
cannot train in this browser, before any step; both say why (a software adapter: fp32 or a GPU, no
flag helps)."""

from __future__ import annotations

import httpx
import pytest

from andrea.web.auth import token_init_script
from tests.browser import GPU_BROWSER

# On a GPU browser (ANDREA_GPU_BROWSER=1) the adapter may well have them: these are SwiftShader's.
pytestmark = pytest.mark.skipif(GPU_BROWSER, reason="SwiftShader's view: no f16 subgroup matrices")


def test_the_form_offers_mixed_only_where_the_adapter_can(page, live_server, page_errors,
                                                         posted_runs):
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
    page.wait_for_function("!document.getElementById('start').disabled")
    options = page.eval_on_selector_all(
        "#precision option", "os => os.map((o) => [o.value, o.selected, o.disabled])")
    assert options == [["fp32", True, False], ["mixed", False, True]]
    assert page.get_attribute("#precision", "data-mixed") == "unavailable"
    note = page.inner_text("#precision-note")
    # SwiftShader never has them: the note names the missing feature and suggests no flag.
    assert "software" in note and "shader-f16" in note and "choose fp32" in note, note
    assert "--enable" not in note, note
    page.click("#start")
    page.wait_for_function("document.getElementById('form-error').textContent"
                           ".includes('held by the test')")
    assert posted_runs[-1]["precision"] == "fp32"
    assert [e for e in page_errors if "status of 422" not in e] == []


def test_a_mixed_run_says_why_it_cannot_train_here(page, live_server):
    run = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny", "precision": "mixed",
                                                      "steps": 5}).json()
    page.add_init_script(token_init_script(run["id"], run["token"]))
    page.goto(f"{live_server}/runs/{run['id']}")
    page.wait_for_function("document.body.dataset.done", timeout=120_000)
    assert page.evaluate("document.body.dataset.done") == "failed"
    error = page.inner_text("#error")
    assert "mixed precision" in error and "f16 subgroup matrices" in error, error
    # SwiftShader never has them: no browser flag is suggested, fp32 or a GPU is.
    assert "software" in error and "precision fp32" in error and "on a GPU" in error, error
    assert "--enable" not in error, error
    assert httpx.get(f"{live_server}/api/runs/{run['id']}/metrics").json() == []
