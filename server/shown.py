"""User text as the server's pages show it (run names in the run page and titles, a path
echoed by the 404 page): Unicode's bidi controls (embeddings, overrides, isolates, marks) each
replaced by U+FFFD, visible, so the text can reorder neither itself (U+202E then "gnp.exe"
reads "exe.png") nor the page around it. The templates' `shown` filter (app.py); the page
controllers do the same with static/js/app/text.js `shownText` (the same set: tested in
tests/api/test_shown.py), and isolate each piece of user text (<bdi>, dir="auto")."""

from __future__ import annotations

# U+061C ALM, U+200E LRM, U+200F RLM, U+202A-U+202E LRE RLE PDF LRO RLO, U+2066-U+2069 LRI RLI
# FSI PDI.
BIDI_CONTROLS = "\u061c\u200e\u200f" + "".join(map(chr, range(0x202A, 0x202F))) \
    + "".join(map(chr, range(0x2066, 0x206A)))
_REPLACED = dict.fromkeys(map(ord, BIDI_CONTROLS), "\ufffd")


def shown_text(text: object) -> str:
    """`text` with every bidi control replaced by U+FFFD."""
    return str(text).translate(_REPLACED)
