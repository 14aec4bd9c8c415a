"""Facts the pages' JavaScript and the server share have one source: the page is rendered with
the server's value, or, where a module must hold its own copy (it runs under Node too), this
test reads both places and holds them equal."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

from andrea import schemas
from andrea.data.bandit import PHASE_LENGTHS
from andrea.data.windows import PASSES_WARNING
from andrea.model import SHAPE_FIELDS
from andrea.run_config import RunConfig
from andrea.runs.info import ENDED, EXPLAINED, RunStatus
from andrea.web.auth import TOKEN_STORAGE_PREFIX, token_init_script

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "static" / "js" / "app"
ENGINE = REPO / "static" / "js" / "engine"


def _js_list(source: str, name: str) -> list[str]:
    """The strings of `export const NAME = [...]` in a module's source."""
    m = re.search(rf"export const {name} = \[(.*?)\];", source, re.S)
    assert m, f"no list {name}"
    return re.findall(r"'([^']*)'", m.group(1))


def test_run_status_lists_are_the_servers():
    src = (APP / "run_status.js").read_text()
    assert _js_list(src, "RUN_STATUSES") == list(typing.get_args(RunStatus))
    assert _js_list(src, "ENDED") == list(ENDED)
    assert _js_list(src, "EXPLAINED") == list(EXPLAINED)
    assert set(ENDED) <= set(typing.get_args(RunStatus)) >= set(EXPLAINED)


VALUE = r"('[^']*'|[\w.+-]+)"    # a JS literal: a number, true/false/null, a '...' string


def _js_value(text: str):
    return text[1:-1] if text.startswith("'") else json.loads(text)


def _js_defaults(params: str) -> dict:
    """The `name = literal` defaults of a JS parameter list; one may pick between two strings
    by an earlier one (`clip_mode = clip ? 'global' : 'off'`)."""
    out = {}
    for name, cond, yes, no, literal in re.findall(
            rf"(\w+) = (?:(\w+) \? ('[^']*') : ('[^']*')|{VALUE})", params):
        out[name] = _js_value((yes if out[cond] else no) if cond else literal)
    return out


def test_optimizer_defaults_are_run_configs():
    want = {k: RunConfig.model_fields[k].default
            for k in ("beta1", "beta2", "eps", "weight_decay", "max_norm", "clip_mode")}
    src = (ENGINE / "optimizer_hyper.js").read_text()
    hyper = re.search(r"export const defaultHyper = \(\) => \(\{(.*?)\}\);", src, re.S).group(1)
    got = {k: _js_value(v) for k, v in re.findall(rf"(\w+): {VALUE}", hyper)}
    assert got == want
    modes = re.search(r"export const CLIP_MODES = \{(.*?)\};", src).group(1)
    assert sorted(re.findall(r"(\w+):", modes)) == \
        sorted(typing.get_args(RunConfig.model_fields["clip_mode"].annotation))
    lab = (ENGINE / "lab_optimizer.js").read_text()
    params = re.search(r"async optimizerSteps\(\{(.*?)\}\)", lab, re.S).group(1)
    got = {k: v for k, v in _js_defaults(params).items() if k in want}
    assert got == want


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
    new_run = (APP / "new_run.js").read_text()
    assert not re.search(r"PASSES_WARNING = \d", new_run) and "'n_layer'" not in new_run
    assert "7-42" not in (REPO / "templates" / "index.html").read_text()
    assert not re.search(r'maxlength="\d', (REPO / "templates" / "run.html").read_text())
    assert "chunk_bytes ??" not in (ENGINE / "trainer.js").read_text()
