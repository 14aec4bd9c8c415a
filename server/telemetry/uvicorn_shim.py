"""The one place that reaches into uvicorn's private websocket internals.

Starlette's WebSocket offers neither thing the sockets need from the server:
- a per-socket message size limit that the websocket layer enforces while it reads (close
  1009), so a big message is refused before it is buffered whole;
- aborting a connection whose peer stopped reading (a close would wait, for ever, for the
  buffer to drain).
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


def abort(ws: WebSocket) -> None:
    """Frees a connection at once, whatever is still buffered for a peer that stopped reading
    (a close would wait for the buffer to drain, for ever)."""
    proto = protocol_of(ws)
    if proto is not None:
        proto.transport.abort()
