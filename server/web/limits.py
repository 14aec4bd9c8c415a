"""Bounds on every HTTP request's body and on how long its bytes may stall, as pure ASGI
middleware: enforced before any route reads a byte.

- A body over Settings.max_body_bytes gets 413 (connection closed): at once when its
  Content-Length says so; without one (chunked), as soon as the bytes received pass the limit,
  so no more than the limit is ever handed on. Checkpoint and weights uploads are exempt: their
  routes know the run's exact size and refuse a byte past it.
- An upload that moves no byte for Settings.idle_timeout_s gets 408 (connection closed); a
  download whose peer reads nothing for as long is cut. The app sees a disconnect either way
  (an upload's route stores nothing).
- An upload that is not whole max(Settings.upload_timeout_s, its size /
  Settings.min_upload_bytes_per_s) seconds after its head came gets 408 too, however it trickles
  (a byte every few seconds resets no idle timer here); its size is its Content-Length, or for a
  chunked body the bytes received so far (so it must keep that average rate).
Websockets pass through: their messages have their own limits (telemetry/protocol.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from andrea.web.quotas import RateLimiter
from andrea.web.uvicorn_limits import transport_of

log = logging.getLogger("andrea.web.limits")

# PUT /api/runs/{id}/checkpoints/{step}, PUT /api/runs/{id}/weights, and a room's
# POST /api/runs/{id}/room/deltas/{version}: each route
# refuses any size but its own exact one, before and while reading.
SIZED_UPLOADS = {
    "PUT": re.compile(r"/api/runs/[^/]+/(checkpoints/[^/]+|weights)"),
    "POST": re.compile(r"/api/runs/[^/]+/room/deltas/[^/]+"),
}
DISCONNECT: Message = {"type": "http.disconnect"}


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodyLimits:
    """413 for a body over `max_body_bytes` (sized uploads exempt); 408 or a cut connection
    for an upload or download that stalls for `idle_timeout_s`; 408 for an upload slower than
    `min_upload_bytes_per_s` once `upload_timeout_s` has passed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, idle_timeout_s: float,
                 upload_timeout_s: float = 60.0, min_upload_bytes_per_s: int = 32 << 10):
        self.app, self.max_body_bytes, self.idle_timeout_s = app, max_body_bytes, idle_timeout_s
        self.upload_timeout_s, self.min_upload_bytes_per_s = \
            upload_timeout_s, min_upload_bytes_per_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pattern = SIZED_UPLOADS.get(scope["method"])
        sized = pattern is not None and pattern.fullmatch(scope["path"])
        limit = None if sized else self.max_body_bytes
        declared = _content_length(scope)
        if limit is not None and declared is not None and declared > limit:
            await _refuse(send, 413, f"the request body is {declared} bytes, over this server's "
                          f"limit of {limit} bytes (ANDREA_MAX_BODY_BYTES; checkpoint and weights "
                          "uploads excepted): it was not read and nothing changed. Send less")
            return
        await _Exchange(scope, receive, send, limit, self.idle_timeout_s, declared,
                        self.upload_timeout_s, self.min_upload_bytes_per_s).run(self.app)


async def _refuse(send: Send, status: int, detail: str) -> None:
    """A JSON answer that closes the connection: the rest of the body is never read."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class _Exchange:
    """One request: its body counted and timed as the app receives it, its answer timed as it
    is sent. Once this middleware has answered (or cut the connection) the app's own answer
    goes nowhere."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, limit: int | None,
                 idle_s: float, declared: int | None, upload_s: float, upload_rate: int):
        self.scope, self._receive, self._send, self.limit, self.idle_s = \
            scope, receive, send, limit, idle_s
        self.received, self.body_done, self.started, self.done = 0, False, False, False
        # The whole body's time: its declared size (None: chunked), the least time any upload
        # has, the rate a longer one must keep; timed from now (its head has come).
        self.declared, self.upload_s, self.upload_rate = declared, upload_s, upload_rate
        self.began = asyncio.get_running_loop().time()

    def allowed_s(self) -> float:
        """Seconds the body may take in all: max(upload_s, size / upload_rate)."""
        size = self.received if self.declared is None else self.declared
        return max(self.upload_s, size / self.upload_rate)

    async def run(self, app: ASGIApp) -> None:
        await app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.done:
            return DISCONNECT
        if self.body_done:      # waiting for a disconnect while the answer streams: no limit
            return await self._receive()
        allowed = self.allowed_s()
        left = self.began + allowed - asyncio.get_running_loop().time()
        try:    # (what has come already is taken, even past the time: timeout(0) never fires)
            async with asyncio.timeout(max(0.0, min(self.idle_s, left))):
                message = await self._receive()
        except TimeoutError:
            if left <= self.idle_s:
                await self._give_up(408, self._too_slow(allowed))
                return DISCONNECT
            await self._give_up(408, f"no byte of the request body arrived for {self.idle_s:g} s "
                                     "(ANDREA_IDLE_TIMEOUT_S): the request was dropped and "
                                     "nothing was stored. Send it again")
            return DISCONNECT
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.limit is not None and self.received > self.limit:
                await self._give_up(413, f"the request body passed this server's limit of "
                                         f"{self.limit} bytes (ANDREA_MAX_BODY_BYTES; checkpoint "
                                         "and weights uploads excepted): it was not read further "
                                         "and nothing changed. Send less")
                return DISCONNECT
            self.body_done = not message.get("more_body", False)
        return message

    def _too_slow(self, allowed: float) -> str:
        size = (f"{self.declared} bytes" if self.declared is not None
                else f"{self.received} bytes so far")
        return (f"the request body was not whole after {allowed:.3g} s, the time this server "
                f"gives a body of its size ({size}): at least {self.upload_s:g} s "
                f"(ANDREA_UPLOAD_TIMEOUT_S), more at {self.upload_rate} bytes/s "
                "(ANDREA_MIN_UPLOAD_BYTES_PER_S). The request was dropped and nothing was "
                "stored: send it again over a faster connection")

    async def send(self, message: Message) -> None:
        if self.done:
            return
        self.started = self.started or message["type"] == "http.response.start"
        try:
            async with asyncio.timeout(self.idle_s):
                await self._send(message)
        except TimeoutError:
            log.info("%s %s: the client read nothing for %g s; connection cut",
                     self.scope["method"], self.scope["path"], self.idle_s)
            self._cut()

    async def _give_up(self, status: int, detail: str) -> None:
        if self.started:    # the app is answering already: all that is left is to hang up
            self._cut()
            return
        self.done = True
        try:
            async with asyncio.timeout(self.idle_s):
                await _refuse(self._send, status, detail)
        except TimeoutError:
            self._cut()

    def _cut(self) -> None:
        """Drops the connection at once (a close would wait for a peer that reads nothing);
        the app's receive then says the client went away."""
        self.done = True
        transport = transport_of(self._receive)
        if transport is not None:
            transport.abort()


# GETs under /api/ that a JSON read budget never delays: the trainer's batches and the downloads
# (their own bounds: the batch route's, exports per address, the idle timeout).
UNPACED_READS = re.compile(r"/api/(runs/[^/]+/)?(batches|val_batches)/[^/]+"
                           r"|/api/runs/[^/]+/(model\.safetensors|export\.zip|checkpoints/[^/]+)")
READ_REQUEST_COST = 128 << 10    # bytes a JSON read costs besides its body (parse, route, store)
READ_BURST_S = 1                 # seconds of read_bytes_per_s a client may read at once
READ_MAX_WAIT_S = 10.0           # a client further in debt is answered 429


class ReadBudget:
    """JSON reads of the API, per client address (Settings.read_bytes_per_s, a READ_BURST_S
    burst): a read costs its body's bytes (before gzip) plus READ_REQUEST_COST (what a request
    costs the server whatever its size), taken when it has been answered; a client
    in debt waits before its next read is served, and one more than READ_MAX_WAIT_S in debt is
    answered 429 with Retry-After. So a polling loop (a spike list, a runs list) is paced to the
    budget whatever its rate or size, and other clients' requests and trainers' acks do not
    wait behind it. Only GET /api/ answered as JSON counts; batches and downloads are never
    delayed (UNPACED_READS). The address is uvicorn's (a trusted proxy's X-Forwarded-For)."""

    def __init__(self, app: ASGIApp, bytes_per_s: float):
        self.app = app
        self.buckets = RateLimiter(bytes_per_s * READ_BURST_S, bytes_per_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" \
                or not scope["path"].startswith("/api/") or UNPACED_READS.fullmatch(scope["path"]):
            await self.app(scope, receive, send)
            return
        bucket = self.buckets.bucket((scope.get("client") or ("",))[0])
        wait = bucket.take(0)       # the debt's seconds, nothing taken
        if wait > READ_MAX_WAIT_S:
            retry = math.ceil(wait - READ_MAX_WAIT_S)
            body = json.dumps({"detail": f"too many reads from this address: its budget is "
                               f"{bucket.rate / (1 << 20):g} MiB/s of answers "
                               f"(ANDREA_READ_BYTES_PER_S); try again in {retry} s"}).encode()
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        if wait:
            await asyncio.sleep(wait)
        sent, counted = 0, False

        async def counting(message: Message) -> None:
            nonlocal sent, counted
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers") or []).get(b"content-type", b"")
                counted = kind.startswith(b"application/json")
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)
        try:
            await self.app(scope, receive, counting)
        finally:
            if counted:
                bucket.take(sent + READ_REQUEST_COST)
