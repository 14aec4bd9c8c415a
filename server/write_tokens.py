"""Run write tokens (and a room's join and worker tokens): made at creation, shown once, stored
only as a hash; the training tab's websocket, the weights upload and a room's workers present
them. Plain functions of strings: the store, the room and the routes all check them."""

from __future__ import annotations

import hashlib
import hmac
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
