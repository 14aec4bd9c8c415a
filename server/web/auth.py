"""Run write tokens: made at run creation, shown once, stored only as a hash; the training
tab's websocket and the weights upload present them."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets


def new_token() -> str:
    """192 random bits, URL-safe; never with a leading "-", which `andrea train --token` would
    read as a flag (a room's join failed so, one token in 64)."""
    while (token := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return token


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token_sha256: str, token: str) -> bool:
    """Constant-time: the comparison does not leak how much of a guess was right."""
    return hmac.compare_digest(token_sha256, token_hash(token))


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
