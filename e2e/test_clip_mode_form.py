"""The new-run form's clipping: a select of RunConfig's clip modes whose choice the form posts
(and the server keeps), and the clipping experiment: three runs of the form's settings, one per
clip mode, with the same seed and the source bandit's data, each run's page opened in a tab of
its own (with its token) and the compare page of the three in this one, which links each run
that still waits for a training tab."""

import re

import httpx

# A run's page (not the API's): the experiment's tabs get a stub instead, so nothing trains here.
RUN_PAGE = re.compile(r"^http://[^/]+/runs/[0-9a-f]+$")


def _ready(page, live_server):
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
    page.wait_for_function("!document.getElementById('start').disabled")


def test_the_clip_mode_select_posts_the_chosen_mode(page, live_server, page_errors, posted_runs):
    posted = posted_runs
    _ready(page, live_server)
    options = page.eval_on_selector_all("#clip_mode option",
                                        "os => os.map((o) => [o.value, o.selected])")
    assert options == [["global", True], ["per_tensor", False], ["off", False]]
    page.select_option("#clip_mode", "per_tensor")
    page.click("#start")
    page.wait_for_function("document.getElementById('form-error').textContent"
                           ".includes('held by the test')")
    assert posted[-1]["clip_mode"] == "per_tensor" and "clip" not in posted[-1]
    # lr and max_norm must be above 0 (the server's bound, which HTML's min cannot say): the
    # page refuses 0 in words, and sends nothing.
    page.fill("input[name=lr]", "0")
    page.fill("input[name=max_norm]", "0")
    page.click("#start")
    assert page.inner_text("#form-error") == ("Cannot start: Learning rate: must be greater than 0;"
                                              " Max grad norm: must be greater than 0")
    assert len(posted) == 1
    page.fill("input[name=lr]", "0.003")
    page.fill("input[name=max_norm]", "1")

    r = httpx.post(f"{live_server}/api/runs", json=posted[-1])       # the server takes it
    assert r.status_code == 201, r.text
    assert r.json()["config"]["clip_mode"] == "per_tensor"
    assert httpx.delete(f"{live_server}/api/runs/{r.json()['id']}").status_code == 204
    assert [e for e in page_errors if "status of 422" not in e] == []


def test_the_clipping_experiment_makes_three_runs_and_compares_them(page, live_server, page_errors):
    page.context.route(RUN_PAGE, lambda route: route.fulfill(content_type="text/html",
                                                            body="<!doctype html><p>run page"))
    tabs = []
    page.context.on("page", lambda tab: tabs.append(tab))
    _ready(page, live_server)
    page.fill("input[name=seed]", "7")
    page.fill("input[name=steps]", "30")
    page.click("#clip-experiment")
    page.wait_for_url("**/compare?ids=*")
    ids = page.url.split("ids=")[1].split(",")
    assert len(ids) == 3
    configs = [httpx.get(f"{live_server}/api/runs/{i}").json()["config"] for i in ids]
    assert [c["clip_mode"] for c in configs] == ["global", "per_tensor", "off"]
    assert {(c["seed"], c["steps"], c["data_mode"]) for c in configs} == {(7, 30, "bandit")}
    made = [httpx.get(f"{live_server}/api/runs/{i}").json() for i in ids]   # told apart in lists
    assert [(r["name"], r["tags"]) for r in made] == [
        ("clip global (clip experiment, tiny, seed 7)", ["clip-experiment", "clip-global"]),
        ("clip per tensor (clip experiment, tiny, seed 7)", ["clip-experiment", "clip-per-tensor"]),
        ("no clip (clip experiment, tiny, seed 7)", ["clip-experiment", "clip-off"])]

    # A tab per run, each with the run's token in its fragment.
    page.wait_for_function("document.body.dataset.ready === '1'")
    assert len(tabs) == 3
    tokens = {}
    for tab in tabs:
        m = re.search(r"/runs/([0-9a-f]+)#token=(.+)$", tab.url)
        assert m, tab.url
        tokens[m.group(1)] = m.group(2)
        tab.close()
    assert sorted(tokens) == sorted(ids)

    # Nothing trains them here: the compare page links each to a tab that would.
    links = page.locator("#train-links a")
    assert links.count() == 3
    for link in links.all():
        run_id = link.get_attribute("data-run-id")
        assert link.get_attribute("href").endswith(f"/runs/{run_id}#token={tokens[run_id]}")
    labels = page.eval_on_selector_all("#baseline option", "os => os.map((o) => o.textContent)")
    # Each label names its clip mode once: the names say it, so the labels do not repeat it.
    words = ["clip global", "clip per tensor", "no clip"]
    assert [lab.split(" (", 1)[0] for lab in labels] == words, labels
    assert all(lab.count(w) == 1 for lab, w in zip(labels, words)), labels
    assert page.locator("#config-diff tr[data-key='clip_mode'] td.differs").count() == 3
    for i in ids:
        assert httpx.delete(f"{live_server}/api/runs/{i}").status_code == 204
    assert not page_errors
