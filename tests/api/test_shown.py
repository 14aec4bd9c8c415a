"""Bidi controls in user text are neutralised where it is shown (shown.py, and the pages'
text.js): a run name could visually reorder itself and the text around it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from andrea.shown import BIDI_CONTROLS, shown_text

# ---- bidi controls in user text are neutralised where it is shown --------------------------------

EVIL = "evil \u202egnp.exe"         # reads "evil exe.png" as it is


def test_the_run_page_and_404_page_show_user_text_isolated_and_neutralised(client):
    run = client.post("/api/runs", json={"preset": "tiny", "steps": 10}).json()
    r = client.patch(f"/api/runs/{run['id']}", json={"name": EVIL, "tags": ["\u2067tag"]})
    assert r.status_code == 200 and r.json()["name"] == EVIL        # stored as given
    html = client.get(f"/runs/{run['id']}").text
    assert not set(BIDI_CONTROLS) & set(html)
    assert '<bdi id="run-name">evil \ufffdgnp.exe</bdi>' in html
    assert "<title>evil \ufffdgnp.exe · Andrea</title>" in html
    r = client.get("/runs/%E2%80%AEabc%E2%81%A6")
    assert r.status_code == 404 and not set(BIDI_CONTROLS) & set(r.text)
    assert "There is no run \ufffdabc\ufffd on this server." in r.text


def test_the_pages_js_neutralises_the_same_characters_as_the_server():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    every = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000)
    script = ("import { shownText } from './static/js/app/text.js';"
              "let s = ''; process.stdin.on('data', (d) => { s += d; });"
              "process.stdin.on('end', () => process.stdout.write("
              "JSON.stringify(shownText(JSON.parse(s)))));")
    out = subprocess.run([node, "--input-type=module", "-e", script], input=json.dumps(every),
                         capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert json.loads(out) == shown_text(every)
    assert shown_text(EVIL) == "evil \ufffdgnp.exe" and len(BIDI_CONTROLS) == 12
