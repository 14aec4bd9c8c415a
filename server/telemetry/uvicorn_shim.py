"""The one place that reaches into uvicorn's private websocket internals.

Starlette's WebSocket offers none of the things the sockets need from the server:
- a per-socket message size limit that the websocket layer enforces while it reads (close
  1009), so a big message is refused before it is buffered whole;
- aborting a connection whose peer stopped reading (a close would wait, for ever, for the
  buffer to drain);
- a lingering close after that 1009: uvicorn closes the socket at once, with the rest of the big
  message unread, so the kernel answers the peer with a reset that can overtake the close
  frame, and the peer sees "no close frame" instead of the reason. The shim sends the close
  frame and a FIN, reads and drops what still comes for at most LINGER_S, then closes.
- a say over the peer's ping frames: websockets answers each with a pong itself, inside
  uvicorn's data_received, before the app could see it, and however fast they come (a flood
  of them costs the event loop as much as messages, while the app waits for the hello or
  reads the socket more slowly). limit_pings hands each ping to the app's budget first.
uvicorn's websockets-sansio protocol (what `andrea serve` runs: uvicorn's `ws="auto"` where the
`websockets` package is installed) has them: the ASGI `receive` it hands the app is a bound
method of the protocol object, whose `conn` (websockets' ServerProtocol) has
`max_message_size` and `recv_frame` (each frame parsed, pings answered there) and whose
`transport` can be paused and aborted. Where that is not so (another server or websockets
implementation) the functions do nothing: protocol.py still checks every message's size once
it has arrived, and pings stay the server's own. tests/api/test_uvicorn_shim.py fails if uvicorn
changes what this relies on. Its HTTP counterpart is andrea/uvicorn_limits.py (header timeout,
per-client cap, cutting a stalled download), pinned by the same tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import WebSocket
from websockets.exceptions import ProtocolError
from websockets.frames import Opcode
from websockets.protocol import State

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


@dataclass(frozen=True)
class CloseFrame:
    """limit_pings' answer to a ping that is one too many: `text` (a message, e.g. the
    protocol's error) is sent, then the close frame (code, reason: at most 123 UTF-8 bytes)."""
    code: int
    reason: str
    text: str | None = None


def limit_pings(ws: WebSocket, on_ping: Callable[[], float | CloseFrame]) -> bool:
    """Each ping frame the peer sends asks on_ping() first, which answers
    - 0: pong as usual;
    - seconds > 0: pong, then nothing more is read from the socket for that long (the peer's
      next frames wait: paced; a message the app has not read yet keeps it paused anyway);
    - a CloseFrame: no pong; its text and close frame are sent, the connection is closed as
      after a too-big message (the app's receive hears the close: WebSocketDisconnect).
    False (nothing done) where uvicorn's protocol is not reachable."""
    proto = protocol_of(ws)
    plain = getattr(getattr(proto, "conn", None), "recv_frame", None)
    if proto is None or not callable(plain):
        return False
    conn, until = proto.conn, [0.0]

    def recv_frame(frame) -> None:
        if frame.opcode is not Opcode.PING or conn.state is not State.OPEN:
            plain(frame)
            return
        verdict = on_ping()
        if isinstance(verdict, CloseFrame):
            if verdict.text is not None:
                conn.send_text(verdict.text.encode("utf-8"))
            conn.fail(verdict.code, verdict.reason)     # the close frame; the rest discarded
            # Ends websockets' parser as a bad frame does: uvicorn then closes the connection
            # (handle_parser_exception, lingering where limit_frames set it) with that frame.
            raise ProtocolError(verdict.reason)
        plain(frame)
        if verdict > 0:
            _pause(proto, verdict, until)

    conn.recv_frame = recv_frame
    return True


def _pause(proto, seconds: float, until: list[float]) -> None:
    """Reads nothing from the peer for `seconds` (from the latest of overlapping pauses)."""
    until[0] = max(until[0], proto.loop.time() + seconds)
    proto.transport.pause_reading()
    proto.loop.call_later(seconds, _resume, proto, until)


def _resume(proto, until: list[float]) -> None:
    if proto.loop.time() < until[0] - 0.01:    # a later pause's own timer resumes
        return
    # uvicorn's own pause (a message the app has not read yet) is uvicorn's to end.
    if not getattr(proto, "read_paused", False) and not proto.transport.is_closing():
        proto.transport.resume_reading()
