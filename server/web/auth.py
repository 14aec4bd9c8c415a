"""A run's write token in the browser: where a page keeps it, and the script that puts it there
for a browser driver (the tokens themselves: write_tokens.py)."""

from __future__ import annotations

import json

# Where a page keeps a run's write token: sessionStorage[TOKEN_STORAGE_PREFIX + run_id] holds
# {"token": ...} as JSON. Every page gets the prefix from templates/base.html (app.py; read by
# static/js/app/api.js), and the browser drivers hand a token over with token_init_script.
TOKEN_STORAGE_PREFIX = "andrea.run."


def token_init_script(run_id: str, token: str) -> str:
    """A page init script (Playwright's add_init_script) that leaves `run_id`'s write token
    where the start page leaves it, so the run page opened next trains the run. Only once: a
    reload after the page took a new token (its resume button) keeps the new one."""
    key = json.dumps(TOKEN_STORAGE_PREFIX + run_id)
    return (f"if (sessionStorage.getItem({key}) === null) "
            f"sessionStorage.setItem({key}, {json.dumps(json.dumps({'token': token}))});")
