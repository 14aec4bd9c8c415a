"""The new-run form's sources: one checkbox per corpus source, all checked, and the run config
it posts carries the checked ones (left out while all are checked: every source)."""

import httpx


def test_form_shows_the_sources_and_posts_the_choice(page, live_server, page_errors, posted_runs):
    posted = posted_runs
    names = [s["name"] for s in httpx.get(f"{live_server}/api/corpus?preset=tiny",
                                          timeout=120).json()["sources"]]
    assert len(names) >= 2
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
    page.wait_for_function("!document.getElementById('start').disabled")
    boxes = page.locator("#sources input[type=checkbox][data-source]")
    assert boxes.evaluate_all("(bs) => bs.map((b) => [b.value, b.checked])") == \
        [[n, True] for n in names]
    assert all(n in page.inner_text("#sources") for n in names)

    # Every source (the default): the config leaves `sources` out.
    page.click("#start")
    page.wait_for_function("!document.getElementById('form-error').hidden")
    assert "held by the test" in page.inner_text("#form-error")
    assert "sources" not in posted[-1]

    # None: refused in the page, nothing sent.
    for n in names:
        page.uncheck(f"#sources input[value='{n}']")
    page.click("#start")
    assert "Sources: pick at least one" in page.inner_text("#form-error")
    assert len(posted) == 1

    # One: posted as the run's sources; the data budget reads only that one.
    page.check(f"#sources input[value='{names[1]}']")
    page.click("#start")
    page.wait_for_function("document.getElementById('form-error').textContent"
                           ".includes('held by the test')")
    assert len(posted) == 2 and posted[-1]["sources"] == [names[1]]
    budget = page.inner_text("#data-budget")
    assert f"passes over {names[0]}\tnot used" in budget
    assert "not used" not in budget.split(f"passes over {names[1]}")[1].split("\n")[0]

    # The server takes what the form posted: a run on that source alone.
    r = httpx.post(f"{live_server}/api/runs", json=posted[-1])
    assert r.status_code == 201, r.text
    assert r.json()["config"]["sources"] == [names[1]]
    assert httpx.delete(f"{live_server}/api/runs/{r.json()['id']}").status_code == 204
    # (Chromium logs each held POST's 422 as a failed resource load: not an error of the page.)
    assert [e for e in page_errors if "status of 422" not in e] == []
