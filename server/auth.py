"""Run write tokens: made at run creation, shown once, stored only as a hash; the training
tab's websocket and the weights upload present them."""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_token() -> str:
    return secrets.token_urlsafe(24)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token_sha256: str, token: str) -> bool:
    """Constant-time: the comparison does not leak how much of a guess was right."""
    return hmac.compare_digest(token_sha256, token_hash(token))
