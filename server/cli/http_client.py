"""The command line's one HTTP client, for `andrea train` and `andrea export --server`: JSON in,
JSON out (or a body streamed into a file), on the standard library alone. An error status
comes back as ServerError with FastAPI's `detail` in words; a server that does not answer
(refused, reset, timed out) as Unreachable. Each command words these for its own user.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, Any

READ_BYTES = 1 << 20


class ServerError(Exception):
    """The server answered `status`; `detail` says why. str(): "GET /path: 404 why"."""

    def __init__(self, method: str, url: str, status: int, detail: str):
        self.method, self.url, self.status, self.detail = method, url, status, detail
        super().__init__(f"{method} {urllib.parse.urlparse(url).path}: {status} {detail}")


class Unreachable(Exception):
    """No answer from the server at `origin` (scheme://host:port); `reason` says why."""

    def __init__(self, url: str, reason):
        u = urllib.parse.urlparse(url)
        self.origin, self.reason = f"{u.scheme}://{u.netloc}", reason
        super().__init__(f"the server at {self.origin} does not answer: {reason}")


class _LocalError(Exception):
    """A write into `into` that failed: this machine's error, not the server's."""

    def __init__(self, error: OSError):
        self.error = error


def request(method: str, url: str, body: Any = None, timeout: float = 30,
            into: IO[bytes] | None = None, token: str | None = None) -> Any:
    """The answer's JSON; with `into`, its body is written there instead (returns None). A
    failed write into `into` raises its own OSError. `token`: sent as `Authorization: Bearer`
    (a run's write token or the operator's)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if into is None:
                return json.load(r)
            got = 0
            while block := r.read(READ_BYTES):
                got += len(block)
                try:
                    into.write(block)
                except OSError as e:
                    raise _LocalError(e) from None
            if r.length:    # (a read with a size ends quietly at a connection closed early)
                raise Unreachable(url, f"the connection closed after {got} bytes, "
                                       f"{r.length} short of the body")
            return None
    except urllib.error.HTTPError as e:
        raise ServerError(method, url, e.code, detail(e)) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise Unreachable(url, getattr(e, "reason", e)) from None
    except _LocalError as e:
        raise e.error from None


def detail(e: urllib.error.HTTPError) -> str:
    """FastAPI's {"detail": ...} in words: a message as it is, a list of validation errors as
    "where: why; ..."; a body that is not that, its first line (or the status's reason)."""
    body = e.read().decode("utf-8", "replace")
    try:
        said = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        lines = body.strip().splitlines()
        return lines[0] if lines else str(e.reason)
    if isinstance(said, list):   # pydantic's errors: where (the body's field) and why
        try:
            return "; ".join(f"{'.'.join(map(str, d['loc'][1:]))}: {d['msg']}" for d in said)
        except (KeyError, TypeError):
            pass
    return str(said)
