"""The new-run form's model shape: left empty it is the preset's (shown as placeholders); given,
the memory estimate is the server's table for that shape, a shape the server refuses says why
and cannot start, and the run made carries the shape."""

import httpx


def memory_rows(page) -> dict[str, str]:
    return dict(page.locator("#memory tr").evaluate_all(
        "(rows) => rows.map((r) => [r.cells[0].textContent, r.cells[1].textContent])"))


def test_form_takes_a_shape_of_its_own(page, live_server, page_errors):
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
    page.wait_for_function("!document.getElementById('start').disabled")
    page.click("#shape summary")
    assert page.get_attribute("input[name=n_layer]", "placeholder") == "2"     # tiny's
    assert page.get_attribute("input[name=n_embd]", "placeholder") == "64"
    tiny = httpx.get(f"{live_server}/api/presets/tiny/layout").json()["n_params"]
    assert memory_rows(page)["parameters"] == f"{tiny / 1e6:.2f} M"

    shape = {"n_layer": 3, "n_embd": 96, "n_head": 3, "ffn_dim": 160}
    for name, value in shape.items():
        page.fill(f"input[name={name}]", str(value))
    page.select_option("#vocab_size", "1024")
    want = httpx.post(f"{live_server}/api/run_config/layout",
                      json={"preset": "tiny", **shape, "vocab_size": 1024}).json()["n_params"]
    page.wait_for_function(f"document.querySelector('#memory').textContent"
                           f".includes('{want / 1e6:.2f} M')", timeout=120_000)
    assert not page.is_disabled("#start")

    page.fill("input[name=n_head]", "5")          # 96 is not divisible by 5
    page.wait_for_function("document.querySelector('#memory').textContent"
                           ".includes('cannot be built')", timeout=120_000)
    # In the form's words: its labels, not the API's names or pydantic's "Value error, ".
    why = page.inner_text("#memory")
    assert "cannot be built: Width (96) must be divisible by Heads (5)" in why
    assert "n_head" not in why and "Value error" not in why
    assert page.is_disabled("#start")

    page.fill("input[name=n_head]", "3")
    page.fill("input[name=steps]", "5")
    page.fill("input[name=eval_every]", "0")
    page.fill("input[name=sample_every]", "0")
    page.wait_for_function("!document.getElementById('start').disabled", timeout=120_000)
    page.click("#start")
    page.wait_for_url("**/runs/*")
    run = httpx.get(f"{live_server}/api/runs/{page.url.rsplit('/', 1)[1]}").json()
    assert {k: run["config"][k] for k in shape} == shape and run["config"]["vocab_size"] == 1024
    assert run["model_name"] == "tiny L3 C96 H3 F160 V1024"
    assert run["n_params"] == want
    # The refused shape's 422 is logged by the browser as a failed resource: nothing else.
    assert not [e for e in page_errors if "status of 422" not in e], page_errors
