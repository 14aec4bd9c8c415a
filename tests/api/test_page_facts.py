"""Facts the pages' JavaScript and the server share have one source: the page is rendered with
the server's value, or, where a module must hold its own copy (it runs under Node too), this
test reads both places and holds them equal."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

from andrea import model_card, schemas
from andrea.app import ROUTERS
from andrea.cli import browser_flags
from andrea.data.bandit import PHASE_LENGTHS
from andrea.data.windows import PASSES_WARNING
from andrea.model import SHAPE_FIELDS
from andrea.page_facts import page_facts
from andrea.run_config import MIXED_DAWN_TOGGLES, RunConfig
from andrea.runs.info import ENDED, EXPLAINED, RunStatus
from andrea.web.auth import TOKEN_STORAGE_PREFIX, token_init_script
from tests.trainer_client import stored_config

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "static" / "js" / "app"
ENGINE = REPO / "static" / "js" / "engine"


def _page_facts(html: str) -> dict:
    """The facts a page was rendered with (templates/base.html: <script id="andrea-facts">)."""
    m = re.search(r'<script type="application/json" id="andrea-facts">(.*?)</script>', html, re.S)
    assert m, "no page facts"
    return json.loads(m.group(1))


def test_the_facts_are_the_servers_own():
    facts = page_facts(ROUTERS)
    assert facts["statuses"] == {"all": list(typing.get_args(RunStatus)), "ended": list(ENDED),
                                 "explained": list(EXPLAINED)}
    assert set(ENDED) <= set(typing.get_args(RunStatus)) >= set(EXPLAINED)
    clip = RunConfig.model_fields["clip_mode"]
    assert list(facts["clip_modes"]) == list(typing.get_args(clip.annotation))
    assert clip.default in facts["clip_modes"]
    fields = RunConfig.model_fields
    assert facts["optimizer_defaults"] == {k: fields[k].default for k in (
        "beta1", "beta2", "eps", "weight_decay", "max_norm", "clip_mode")}
    # The model card says a run's clipping from the same table.
    cfg = {**facts["optimizer_defaults"], "optimizer": "adamw", "clip_mode": "per_tensor",
           "max_norm": 0.5}
    assert model_card.optimizer_text(stored_config(**cfg)).endswith(
        ", per-tensor gradient clipping at norm 0.5")


def test_the_pages_make_their_urls_from_the_servers_routes(client):
    """No page module writes an API, page or socket path of its own: each is routePath(name)
    over the routes the app serves, and every name a module asks for is one of them."""
    routes = page_facts(ROUTERS)["routes"]
    assert routes["get_run"] == "/api/runs/{run_id}"
    assert routes["trainer_socket"] == "/ws/runs/{run_id}"
    asked = set()
    for folder in (APP, ENGINE):
        for path in folder.glob("*.js"):
            src = path.read_text()
            code = re.sub(r"^\s*(//|\*|/\*\*).*$", "", src, flags=re.M)     # comments aside
            assert not re.search(r"[`'](/api/|/ws/|/runs[/`']|/compare)", code), path.name
            asked |= set(re.findall(r"routePath\('(\w+)'", src))
    assert asked and asked <= set(routes), asked - set(routes)
    # The table is the app's: the app makes each path from the route's name.
    for name, path in routes.items():
        params = {k: "{" + k + "}" for k in re.findall(r"\{(\w+)", path)}
        assert client.app.url_path_for(name, **params) == path, name


def test_the_benches_set_the_servers_dawn_toggles():
    """bench/dawn.mjs runs under Node where no server is: its copy is held to the server's."""
    src = (REPO / "bench" / "dawn.mjs").read_text()
    copy = re.search(r"const MIXED_DAWN_TOGGLES = \[(.*?)\];", src).group(1)
    assert re.findall(r"'([^']*)'", copy) == list(MIXED_DAWN_TOGGLES)
    assert "--enable-dawn-features=" + ",".join(MIXED_DAWN_TOGGLES) in browser_flags.GPU


def test_every_page_is_rendered_with_the_facts(client):
    run = client.post("/api/runs", json={"preset": "tiny"}).json()
    for path in ["/", f"/runs/{run['id']}", "/runs", "/compare", "/kernels", "/lab",
                 "/diagnostics", "/runs/no-such-run"]:
        facts = _page_facts(client.get(path).text)
        assert facts == page_facts(ROUTERS), path
        assert list(facts["clip_modes"]) == list(page_facts(ROUTERS)["clip_modes"])   # in order
    # The form's clipping choices are in the facts' words.
    html = client.get("/").text
    for mode, words in page_facts(ROUTERS)["clip_modes"].items():
        assert re.search(rf'<option value="{mode}"[^>]*>{re.escape(words["choice"])}</option>',
                         html.replace("&#39;", "'")), mode


def test_pages_are_rendered_with_the_servers_facts(client):
    html = client.get("/").text
    assert f'data-run-token-key="{TOKEN_STORAGE_PREFIX}"' in html
    passes = re.search(r'data-passes-warning="([^"]+)"', html).group(1)
    assert float(passes) == PASSES_WARNING
    assert f"phases of {min(PHASE_LENGTHS)}-{max(PHASE_LENGTHS)} steps" in html
    shape = re.search(r'data-shape-fields="([^"]+)"', html).group(1).split()
    assert sorted(shape) == sorted(["preset", *SHAPE_FIELDS, "seq_len"])
    run = client.post("/api/runs", json={"preset": "tiny"}).json()
    html = client.get(f"/runs/{run['id']}").text
    assert f'data-run-token-key="{TOKEN_STORAGE_PREFIX}"' in html
    assert re.search(rf'id="edit-name" maxlength="{schemas.NAME_MAX}"', html)
    assert re.search(rf'id="edit-notes" rows="3" maxlength="{schemas.NOTES_MAX}"', html)


def test_the_token_init_script_leaves_what_api_js_reads():
    script = token_init_script("r1", 'a"b')
    # Only when the tab has no token for the run yet (its resume button may have put a new one).
    m = re.fullmatch(r"if \(sessionStorage\.getItem\((.*)\) === null\) "
                     r"sessionStorage\.setItem\((.*), (.*)\);", script)
    assert json.loads(m.group(1)) == json.loads(m.group(2)) == TOKEN_STORAGE_PREFIX + "r1"
    m = re.fullmatch(r".*setItem\((.*), (.*)\);", script)
    assert json.loads(json.loads(m.group(2))) == {"token": 'a"b'}
    api = (APP / "api.js").read_text()
    assert "dataset.runTokenKey" in api and "JSON.stringify({ token })" in api


def test_no_page_keeps_its_own_copy():
    """Fetch errors and the token key go through api.js; the numbers come from the server."""
    for path in APP.glob("*.js"):
        src = path.read_text()
        if path.name != "api.js":
            assert "sessionStorage." not in src, path.name
            assert not re.search(r"\.detail\b", src), path.name
        assert "andrea.run." not in src, path.name
    for folder in ("server", "e2e", "bench", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name not in ("auth.py", "test_page_facts.py"):
                assert "andrea.run." not in path.read_text(), path
    # Statuses, clip modes' words and the optimizer's defaults come from the page facts.
    for folder in (APP, ENGINE):
        for path in folder.glob("*.js"):
            src = path.read_text()
            # (the lists' tails: a trainer's own states may name some statuses)
            tails = r"'interrupted',\s*'abandoned'|'failed',\s*'interrupted'"
            assert not re.search(tails, src), path
            assert "clip per tensor" not in src and "max_norm: 1.0" not in src, path
            assert not re.search(r"beta2(: | = )0\.95", src), path
    new_run = (APP / "new_run.js").read_text()
    assert not re.search(r"PASSES_WARNING = \d", new_run) and "'n_layer'" not in new_run
    assert "7-42" not in (REPO / "templates" / "index.html").read_text()
    assert not re.search(r'maxlength="\d', (REPO / "templates" / "run.html").read_text())
    assert "chunk_bytes ??" not in (ENGINE / "trainer.js").read_text()
