"""The connection limits uvicorn lacks, as a subclass of the HTTP protocol class that uvicorn's
`http="auto"` picks (httptools' when it is installed, else h11's); with uvicorn_shim.py the only
code that reaches into uvicorn's internals (tests/api/test_uvicorn_shim.py pins what both rely on).

- A header timeout (Settings.header_timeout_s): a connection that has not sent a whole request
  head that long after it opened, or after the first byte of a keep-alive's next request, is
  closed (408 if some of a head came). uvicorn's timeout_keep_alive only covers the silence
  between requests, and a trickle of bytes resets it.
- A request head is at most MAX_HEAD_BYTES (431 past it, before the parser sees it): its bytes
  counted up to the blank line that ends it, whether it comes in one read or a byte a read.
  httptools sets no limit of its own. (A pipelined request's head that comes in the same read
  as the request before it is parsed with it: bounded by that read, 256 KiB at most.)
- At most Settings.max_connections_per_client open connections per client address, websockets
  included (503 with Retry-After and the connection closed at once past it).

uvicorn's own settings do the rest (cli.py): limit_concurrency (503 past max_connections in all)
and timeout_keep_alive. `transport_of` lets limits.py cut an HTTP connection whose peer stopped
reading (a close would wait for ever for the buffer to drain).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from andrea.config import Settings

# h11's default limit is 16 KiB; browsers' heads are a few KiB (cookies, tokens included).
MAX_HEAD_BYTES = 64 << 10


def transport_of(receive) -> asyncio.Transport | None:
    """The connection behind an HTTP request's ASGI `receive` (uvicorn's request cycle), or
    None where it is not reachable (another server, a middleware that wrapped receive)."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    return transport if callable(getattr(transport, "abort", None)) else None


def _answer(status: str, text: str, *headers: str) -> bytes:
    body = text.encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8",
            f"content-length: {len(body)}", "connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _peer(transport: asyncio.Transport) -> str:
    name = transport.get_extra_info("peername")
    return str(name[0]) if isinstance(name, tuple) and name else ""


class LimitedHTTPProtocol(AutoHTTPProtocol):
    """uvicorn's HTTP protocol with a header timeout, a head size limit and a per-client cap.
    `bound_to(settings)` makes one for a server; this class itself (the form a --workers
    process imports by name) reads ANDREA_* once in each process."""

    settings: ClassVar[Settings | None] = None
    open_per_client: ClassVar[dict[str, int]] = {}      # this process' connections, by address

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cls = type(self)
        if cls.settings is None:
            cls.settings = Settings()
        self._peer, self._counted = _peer(transport), False
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head, self._head_bytes, self._seen_cycle = True, 0, None
        self._head_tail = b""       # the head's last 3 bytes so far: its blank line may be split
        self._body_pending = False  # an answered request's body is still arriving
        cap = cls.settings.max_connections_per_client
        if cls.open_per_client.get(self._peer, 0) >= cap:
            transport.write(_answer(
                "503 Service Unavailable",
                f"too many open connections from {self._peer}: this server keeps at most {cap} "
                "per client address (ANDREA_MAX_CONNECTIONS_PER_CLIENT); close some and retry",
                "retry-after: 5"))
            transport.close()
            return
        cls.open_per_client[self._peer] = cls.open_per_client.get(self._peer, 0) + 1
        self._counted = True
        self._arm_head_timer()      # a fresh connection that sends nothing is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head:
            if self._head_timer is None:    # a keep-alive's next request: timed from its 1st byte
                self._arm_head_timer()
            if self._head_passes_limit(data):     # the parser never sees it
                if not self.transport.is_closing():
                    self._cancel_head_timer()
                    self.transport.write(_answer(
                        "431 Request Header Fields Too Large",
                        f"the request head passed {MAX_HEAD_BYTES} bytes: send fewer or smaller "
                        "headers"))
                    self.transport.close()
                return
        super().data_received(data)
        if self.transport.get_protocol() is not self:      # upgraded to a websocket
            self._cancel_head_timer()
            self._hand_over(self.transport.get_protocol())
        elif self.cycle is not self._seen_cycle:            # a whole head came: a request runs
            self._seen_cycle, self._awaiting_head = self.cycle, False
            self._cancel_head_timer()

    def _head_passes_limit(self, data: bytes) -> bool:
        """Counts the head's bytes that `data` brings: True when the head has more than
        MAX_HEAD_BYTES, i.e. its blank line (CRLF CRLF, maybe split over reads) does not end
        within the bytes it may still have. The bytes after that line (the body, or a line that
        started no request) are counted too: a head that never starts a request stays bounded."""
        room = MAX_HEAD_BYTES - self._head_bytes
        if len(data) > room and b"\r\n\r\n" not in self._head_tail + data[:max(room, 0)]:
            return True
        self._head_bytes += len(data)
        self._head_tail = (self._head_tail + data[-3:])[-3:]
        return False

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None
                                                or self.cycle.response_complete):
            if self.cycle is not None and self.cycle.more_body:
                # Answered before its body came (a refusal that reads none): the bytes still
                # to come are that body, not a next head; the head is timed from its end
                # (on_message_complete), so a late body never reads as a trickled head (408
                # to the client's next request on this connection).
                self._body_pending = True
                return
            self._awaiting_head, self._head_bytes, self._head_tail = True, 0, b""

    def on_message_complete(self) -> None:
        """httptools: the request's last body byte parsed (after its answer, where that came
        first). h11 has no such hook: there the next request's head goes untimed instead."""
        super().on_message_complete()
        if getattr(self, "_body_pending", False) and not self.transport.is_closing():
            self._body_pending = False
            self._awaiting_head, self._head_bytes, self._head_tail = True, 0, b""

    # ---- the header timer and the per-client count ----

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(type(self).settings.header_timeout_s,
                                                self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:    # a silent connection is closed silently (a browser's preconnect)
            self.transport.write(_answer(
                "408 Request Timeout",
                f"the request head did not arrive within {type(self).settings.header_timeout_s:g}"
                " s (ANDREA_HEADER_TIMEOUT_S): send it whole, at once"))
        self.transport.close()

    def _release(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            counts = type(self).open_per_client
            counts[self._peer] -= 1
            if counts[self._peer] <= 0:
                del counts[self._peer]

    def _hand_over(self, ws_protocol: asyncio.Protocol) -> None:
        """The websocket protocol now owns the connection: it gives the count back when the
        connection is lost (this object never hears of it)."""
        if not self._counted:
            return
        self._counted = False
        lost = ws_protocol.connection_lost
        me = self

        def connection_lost(exc: Exception | None) -> None:
            try:
                lost(exc)
            finally:
                me._counted = True
                me._release()
        ws_protocol.connection_lost = connection_lost   # type: ignore[method-assign]


def bound_to(settings: Settings) -> type[LimitedHTTPProtocol]:
    """The protocol class for one server (uvicorn.Config(http=...)): its settings, its counts."""
    return type("LimitedHTTPProtocol", (LimitedHTTPProtocol,),
                {"settings": settings, "open_per_client": {}})
