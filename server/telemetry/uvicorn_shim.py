"""The one place that reaches into uvicorn's private websocket internals.

Starlette's WebSocket offers neither thing the sockets need from the server:
- a per-socket message size limit that the websocket layer enforces while it reads (close
  1009), so a big message is refused before it is buffered whole;
- aborting a connection whose peer stopped reading (a close would wait, for ever, for the
  buffer to drain);
- a lingering close after that 1009: uvicorn closes the socket at once, with the rest of the big
  message unread, so the kernel answers the peer with a reset that can overtake the close
  frame, and the peer sees "no close frame" instead of the reason. The shim sends the close
  frame and a FIN, reads and drops what still comes for at most LINGER_S, then closes.
uvicorn's websockets-sansio protocol (what `andrea serve` runs: uvicorn's `ws="auto"` where the
`websockets` package is installed) has both: the ASGI `receive` it hands the app is a bound
method of the protocol object, whose `conn` (websockets' ServerProtocol) has
`max_message_size` and whose `transport` can be aborted. Where that is not so (another server
or websockets implementation) both functions do nothing: protocol.py still checks every
message's size once it has arrived. tests/test_uvicorn_shim.py fails if uvicorn changes what
this relies on. Its HTTP counterpart is andrea/uvicorn_limits.py (header timeout, per-client
cap, cutting a stalled download), pinned by the same tests.
"""

from __future__ import annotations

from fastapi import WebSocket

# How long a socket closed for a too-big message keeps reading (and dropping) the rest of it, so
# the peer can read the close frame before the connection goes (nginx's lingering_time, scaled
# to a message of at most a few MiB on a LAN).
LINGER_S = 2.0


def protocol_of(ws: WebSocket):
    """uvicorn's protocol object behind the socket, or None where it is not reachable."""
    proto = getattr(ws._receive, "__self__", None)
    if hasattr(proto, "transport") and hasattr(getattr(proto, "conn", None),
                                               "max_message_size"):
        return proto
    return None


def limit_frames(ws: WebSocket, max_bytes: int) -> None:
    """Messages over max_bytes are refused by the websocket layer (close 1009), never
    buffered whole. (The first frame may still be checked against the server's own limit;
    protocol.receive checks every message again.)"""
    proto = protocol_of(ws)
    if proto is not None:
        proto.conn.max_message_size = max_bytes
        if hasattr(proto, "handle_parser_exception"):
            proto.handle_parser_exception = lambda: _close_lingering(proto)


def _close_lingering(proto) -> None:
    """uvicorn's handle_parser_exception (the app hears the close, the close frame is sent),
    but the socket keeps reading until the peer closes or LINGER_S passes. Called again for
    every piece that still arrives: websockets' parser drops them once it has failed."""
    if proto.close_sent:
        return
    sent = proto.conn.close_sent
    proto.queue.put_nowait({"type": "websocket.disconnect", "code": sent.code,
                            "reason": sent.reason})
    proto.transport.write(b"".join(proto.conn.data_to_send()))
    proto.close_sent = True
    if proto.transport.can_write_eof():
        proto.transport.write_eof()
    # uvicorn's own close timer: the app's end leaves the socket to it, connection_lost cancels it.
    proto.close_timer = proto.loop.call_later(LINGER_S, proto.transport.close)


def abort(ws: WebSocket) -> None:
    """Frees a connection at once, whatever is still buffered for a peer that stopped reading
    (a close would wait for the buffer to drain, for ever)."""
    proto = protocol_of(ws)
    if proto is not None:
        proto.transport.abort()
