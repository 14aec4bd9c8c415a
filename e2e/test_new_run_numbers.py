"""What a new user reads, as Chromium lays it out. The new-run form: the Room fieldset's "Room
run" checkbox sits before its words on one line, as the form's other checkboxes do (it stood
above them, its label a column), and the optimizer state's bytes per parameter reads as the
design says it (8 for fp32 m and v, not 8.0183). A finished run's page counts its spikes "in
all", not "so far"."""

import re

import httpx

from e2e.tensor_records import send
from tests.unit.test_spikes import run as synthetic_records

# The checkbox and the words after it in its label: their boxes (the words' from a Range over
# the label's text nodes) and the label's flex direction.
BOXES = """(selector) => {
  const box = document.querySelector(selector);
  const label = box.closest('label');
  const range = document.createRange();
  const texts = [...label.childNodes].filter((n) => n.nodeType === 3 && n.textContent.trim());
  range.setStartBefore(texts[0]);
  range.setEndAfter(texts[0]);
  const first = range.getClientRects()[0];   // the words' first line
  const b = box.getBoundingClientRect();
  return { box: [b.left, b.top, b.right, b.bottom], text: [first.left, first.top, first.right,
    first.bottom], direction: getComputedStyle(label).flexDirection,
    color: getComputedStyle(label).color };
}"""


def _beside(page, selector: str) -> dict:
    r = page.evaluate(BOXES, selector)
    (_, bt, br, bb), (tl, tt, _, tb) = r["box"], r["text"]
    middle = (bt + bb) / 2
    assert tt <= middle <= tb, f"{selector}: the checkbox is not on its words' line: {r}"
    assert 0 <= tl - br <= 16, f"{selector}: the words do not follow the checkbox: {r}"
    return r


def test_room_checkbox_sits_with_its_label_and_state_reads_in_sensible_bytes(page, live_server,
                                                                             page_errors):
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.goto(live_server + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
    page.wait_for_function("!document.getElementById('start').disabled")

    room = _beside(page, "#room-run")
    mirror = _beside(page, "input[name=f16_mirror]")  # the form's other checkboxes, as they were
    assert room["direction"] == mirror["direction"] == "row"
    assert room["color"] == mirror["color"]
    gap = lambda r: r["text"][0] - r["box"][2]    # noqa: E731
    assert abs(gap(room) - gap(mirror)) < 1, (room, mirror)
    # Its label still toggles it, and the room's fields with it.
    page.click("text=Room run: trained together")
    assert page.is_checked("#room-run")
    assert page.is_visible("#room-fields")

    # tiny's fp32 m and v over its padded tensors: 8.0183 B per parameter, read as 8.02.
    memory = page.inner_text("#memory")
    per_param = re.findall(r"\(([0-9.]+) B/param\)", memory)
    assert per_param == ["8.02"], memory
    page.check("input[name=optimizer][value=adamw_8bit]")
    page.wait_for_function("document.getElementById('memory').textContent.includes('8-bit')")
    per_param = re.findall(r"\(([0-9.]+) B/param\)", page.inner_text("#memory"))
    assert len(per_param) == 1 and re.fullmatch(r"\d+(\.\d{1,2})?", per_param[0]), per_param
    assert page_errors == []


def test_a_finished_runs_page_counts_its_spikes_in_all(page, live_server, page_errors):
    # (A fresh server's first run waits for its corpus: more than httpx's 5 s here.)
    made = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny", "steps": 80},
                      timeout=300).json()
    send(live_server, made, synthetic_records({40: {"grad_norm": 5.0}, 60: {"grad_norm": 6.0}},
                                              n=80))
    page.goto(f"{live_server}/runs/{made['id']}")
    page.wait_for_selector("#spikes[data-count='2']", timeout=120_000)
    assert page.evaluate("document.body.dataset.status") == "finished"
    rule = page.inner_text("#spikes-rule")
    assert rule.endswith(" 2 in all."), rule
    assert "so far" not in rule, rule
    assert page_errors == []
