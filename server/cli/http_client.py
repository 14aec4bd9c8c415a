"""The command line's one HTTP client, for `andrea train` and `andrea export --server`: JSON in,
JSON out (or a body streamed into a file), over httpx. An error status comes back as
ServerError with FastAPI's `detail` in words; a server that does not answer (refused, reset,
timed out, a body cut short) as Unreachable. Each command words these for its own user.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import IO, Any

import httpx

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


def request(method: str, url: str, body: Any = None, timeout: float = 30,
            into: IO[bytes] | None = None, token: str | None = None) -> Any:
    """The answer's JSON; with `into`, its body is written there instead (returns None). A
    failed write into `into` raises its own OSError; a URL that is not http(s), ValueError.
    `token`: sent as `Authorization: Bearer` (a run's write token or the operator's)."""
    # identity: bodies come as the server has them (no gzip), and a short one counts in them
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    content = json.dumps(body).encode() if body is not None else None
    try:
        with httpx.stream(method, url, content=content, headers=headers, timeout=timeout,
                          follow_redirects=True) as r:
            if not r.is_success:
                raise ServerError(method, url, r.status_code, detail(r))
            if into is None:
                return json.loads(r.read())
            _stream_into(r, into, url)
            return None
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
        raise ValueError(f"{e} ({url!r})") from None
    except httpx.TransportError as e:
        raise Unreachable(url, e) from None


def _stream_into(r: httpx.Response, into: IO[bytes], url: str) -> None:
    """The body into `into` as it comes (a failed write: its own OSError); one cut short of its
    Content-Length says by how much."""
    try:
        for block in r.iter_raw(READ_BYTES):
            into.write(block)
    except httpx.RemoteProtocolError:
        length = int(r.headers.get("content-length") or 0)
        got = r.num_bytes_downloaded
        if got >= length:
            raise
        raise Unreachable(url, f"the connection closed after {got} bytes, "
                               f"{length - got} short of the body") from None


def detail(r: httpx.Response) -> str:
    """FastAPI's {"detail": ...} in words: a message as it is, a list of validation errors as
    "where: why; ..."; a body that is not that, its first line (or the status's reason)."""
    body = r.read().decode("utf-8", "replace")
    try:
        said = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        lines = body.strip().splitlines()
        return lines[0] if lines else r.reason_phrase
    if isinstance(said, list):   # pydantic's errors: where (the body's field) and why
        try:
            return "; ".join(f"{'.'.join(map(str, d['loc'][1:]))}: {d['msg']}" for d in said)
        except (KeyError, TypeError):
            pass
    return str(said)
