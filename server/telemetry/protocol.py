"""The telemetry wire protocol: its messages (pydantic models), their parsing and size limits,
the close codes, and how both sockets accept (the Origin check), read and close.

Trainer (`/ws/runs/{id}`, trainer.py), client -> server:
  {"type": "hello", "token": str, "last_acked_step": int | null}   first message, always
  {"type": "metrics", "records": [Record, ...]}                     batched, ~every 250 ms
      (a record's source_losses keys are indices of the run's sources, its row_losses one per
      row of the run's batch, its tensor_grad_norms and tensor_nonfinite one per tensor of the
      run's layout (record_checks.py), checked before any record of the message is committed:
      1003 otherwise, naming the field and the step)
  {"type": "status", "status": "running" | "paused" | "finished" | "stopped" | "failed",
   "message"?: str, "adapter"?: {...}}
  {"type": "sample", "step": int, "text": str}                      generated text
  {"type": "ping"}
  (and websocket ping frames, which the websocket layer answers with a pong)
server -> client: welcome {last_committed_step, records_per_message}, ack {step}, pong,
error {message, kind?} (then the close), notice {message} (the socket stays open: e.g. the
run's sample quota is reached, later samples are dropped; once per socket). A trainer sends at
most records_per_message records per metrics message; past Settings.metrics_rate_per_s records
a second, or Settings.metrics_bytes_per_s bytes a second of its messages (or
client_metrics_bytes_per_s from its address, all its trainer sockets together), the server
reads its socket more slowly (acks come later, nothing is refused). Pings count too (each a
few KiB: trainer.py PING_COST), ping messages and ping frames alike, and so does what a
socket sends before its hello (against its address alone: until then it is no run's); a
socket that sends ping frames faster than trainer.PING_FRAMES allows is closed 1008.
Steps are those of the run: 0 .. its `steps`. A finished or failed run stays so: only
POST /api/runs/{id}/resume (a checkpoint) or a branch trains it again.

Viewers (`/ws/runs/{id}/watch[?after=N]`, viewer.py) get {"type": "records", "records": [...]}
(the backlog after step N first, streamed from the store in pages, then live), {"type": "run",
"run": {...}} on status changes and when the run's trainer goes or comes back (its
`connected`), {"type": "sample", ...}, and {"type": "resumed", "step": K}
when a tab takes the run over from checkpoint K (the records after K are deleted: drop them;
a reconnect with ?after=N past a resume gets that too, and the records after K again). Viewers
are sent exactly what the store committed (first write wins). A viewer may send
{"type": "from", "step": N} (resend everything after N) or {"type": "ping"}; nothing else, and
nothing big (1009). One that falls more than Settings.viewer_queue_bytes behind is closed 1013
(it reconnects with ?after=its last step); a send that does not complete within
Settings.viewer_send_timeout_s frees the connection.

One trainer per run: a second hello while one is connected is refused, and so is the token a
resume revoked (services/runs.py resume).
Close codes (an error message comes first; each refusal's kind picks its code: web/errors.py
WS_CLOSE): 1003 bad data, 1008 policy (origin, token, revoked
token, the run already has a trainer, unknown run, a finished run, too many viewer sockets from
one address, a flood of ping frames: kind `ping_flood`), 1009 too big, 1013 try again later
(a viewer too slow to keep up; the server cannot store records: full disk, read-only data
dir — the trainer keeps its unacked records and reconnects), 4507 STORAGE_BUDGET (storage.py:
the trainer's records, sample or status change would cross the data dir's free-space floor,
or its run's max_run_bytes; nothing of that message was stored, everything acked before it
is): the close reason and the error message start with the kind, "disk_floor: ..." or
"run_bytes: ...", and the error carries it as `kind`; the trainer keeps its unacked records
and tries again slowly (every 30 s: the operator may free space or delete runs meanwhile).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal, Union

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from andrea.config import Settings, page_port
from andrea.errors import DISK_FULL, MALFORMED, TOO_LARGE, Refusal, Refused
from andrea.metrics import Record, Step
from andrea.runs.info import TrainerStatus
from andrea.telemetry.uvicorn_shim import CloseFrame, abort, limit_frames
from andrea.web.errors import WS_CLOSE, close_code

# One metrics batch (UTF-8 bytes; a record: ~200 B + its lists). Parsing a message holds the
# event loop (pydantic's validation keeps the GIL, so a thread does not help): at 256 KiB one
# takes ~3 ms, so no trainer's message delays another's ack by more (1 MiB took 7-17 ms).
# The page splits its records by it (welcome.max_message_bytes).
MAX_MESSAGE_BYTES = 256 << 10
# Frames past this are refused by the websocket layer itself (close 1009) where the server
# lets us set it (uvicorn_shim.py); between the two, the error message comes first.
TRAINER_FRAME_BYTES = 2 * MAX_MESSAGE_BYTES
VIEWER_MESSAGE_BYTES = 4096      # a viewer only ever says "from" or "ping"
# The trainer's close code when the storage budget refuses its message (storage.StorageFull).
STORAGE_BUDGET = WS_CLOSE[DISK_FULL]
# Records per metrics message a trainer sends (told in welcome): ~100 KiB, far below the limit.
RECORDS_PER_MESSAGE = 500
MAX_RECORDS = 4 * RECORDS_PER_MESSAGE   # accepted per message
MAX_SAMPLE_CHARS = 20_000
MAX_ADAPTER_KEYS = 32


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class Hello(_Msg):
    type: Literal["hello"]
    token: Annotated[str, Field(max_length=256)]
    last_acked_step: Step | None = None


class Metrics(_Msg):
    type: Literal["metrics"]
    records: Annotated[list[Record], Field(min_length=1, max_length=MAX_RECORDS)]


class Status(_Msg):
    type: Literal["status"]
    status: TrainerStatus
    message: Annotated[str, Field(max_length=2000)] | None = None
    adapter: Annotated[dict[Annotated[str, Field(max_length=64)],
                            Annotated[str, Field(max_length=256)] | bool | int | float],
                       Field(max_length=MAX_ADAPTER_KEYS)] | None = None


class Sample(_Msg):
    type: Literal["sample"]
    step: Step
    text: Annotated[str, Field(max_length=MAX_SAMPLE_CHARS)]


class Ping(_Msg):
    type: Literal["ping"]


class From(_Msg):
    """A viewer's: send everything after `step` again (what it has lost track of)."""
    type: Literal["from"]
    step: Annotated[int, Field(ge=-1, le=1_000_000_000)]


TrainerMessage = TypeAdapter(Annotated[Union[Metrics, Status, Sample, Ping, Hello],
                                       Field(discriminator="type")])
ViewerMessage = TypeAdapter(Annotated[Union[From, Ping], Field(discriminator="type")])


# What a refusal is, for a client to tell refusals apart: the error message's `kind` (its text
# is for people). A trainer's page retries `busy` a few times (its own previous socket may hold
# the run for a moment after a network drop) and takes every other 1008 or 1003, `revoked`
# among them, as final.
BUSY = "busy"               # another trainer holds the run
REVOKED_TOKEN = "revoked"   # the run was resumed elsewhere: this token is void
PING_FLOOD = "ping_flood"   # websocket ping frames far faster than any client needs


class ProtocolError(Refused):
    """A socket's refusal: its kind (errors.Refusal: the close code is web/errors.py's
    WS_CLOSE) and the error message that says why, with its `tag` where a client acts on it
    (BUSY, REVOKED_TOKEN, PING_FLOOD, a storage budget's kind)."""

    def __init__(self, kind: Refusal, message: str, tag: str | None = None):
        super().__init__(kind, message)
        self.tag = tag


async def accept(ws: WebSocket, settings: Settings, max_bytes: int) -> bool:
    """Accepts the socket, its messages limited to `max_bytes` by the websocket layer where it
    can be (uvicorn_shim.py); False, the socket closed 1008, for a page of another origin."""
    if not _origin_ok(ws, settings):
        await ws.close(code=1008, reason="origin not allowed")
        return False
    limit_frames(ws, max_bytes)
    await ws.accept()
    return True


def _origin_ok(ws: WebSocket, settings: Settings) -> bool:
    """A browser's Origin must be one of the allowed hosts on this server's port (the Host
    header has been checked against the same list by app.HostCheck); a client without an
    Origin (CLI, tests) is no page, and the token still guards writes."""
    origin = ws.headers.get("origin")
    if origin is None:
        return True
    return settings.origin_allowed(origin, page_port(ws.headers.get("host", ""),
                                                     ws.scope.get("scheme", "ws")))


def _text_of(raw: dict, limit: int) -> str:
    """The text of an ASGI websocket event, at most `limit` UTF-8 bytes."""
    if raw["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(raw.get("code", 1000))
    text = raw.get("text")
    if text is None:
        data = raw.get("bytes") or b""
        if len(data) > limit:
            raise ProtocolError(TOO_LARGE, f"message of {len(data)} bytes is over {limit}")
        raise ProtocolError(MALFORMED,
                            "binary messages are not part of the protocol; send JSON text")
    # Bytes, not characters: a character is up to 4 bytes (counted only when it matters).
    size = len(text) if len(text) * 4 <= limit else len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ProtocolError(TOO_LARGE, f"message of {size} bytes is over {limit}")
    return text


def _parse(adapter: TypeAdapter, text: str):
    try:
        return adapter.validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) + _step_of(text, first["loc"])
        raise ProtocolError(MALFORMED, f"invalid message at {where or 'top level'}: {first['msg']}")


def _step_of(text: str, loc: tuple) -> str:
    """" (step N)" for an error inside record i of a metrics message whose step is a number:
    the trainer finds the record by it. (Read again only on an error.)"""
    if len(loc) < 3 or loc[:2] != ("metrics", "records") or not isinstance(loc[2], int):
        return ""
    try:
        step = json.loads(text)["records"][loc[2]]["step"]
    except (ValueError, LookupError, TypeError):
        return ""
    return f" (step {step})" if type(step) is int else ""


async def receive(ws: WebSocket, adapter: TypeAdapter, limit: int):
    """The next message, parsed by `adapter` (TrainerMessage, ViewerMessage)."""
    return _parse(adapter, _text_of(await ws.receive(), limit))


async def receive_text(ws: WebSocket, limit: int) -> tuple[str, int]:
    """(the next message's text, its UTF-8 bytes), not parsed yet (parse)."""
    text = _text_of(await ws.receive(), limit)
    return text, len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def parse(adapter: TypeAdapter, text: str):
    """A message's text parsed by `adapter` (ProtocolError MALFORMED where it is not one)."""
    return _parse(adapter, text)


async def receive_sized(ws: WebSocket, adapter: TypeAdapter, limit: int):
    """(the next message, its UTF-8 bytes): what the trainer's rates and storage count."""
    text, size = await receive_text(ws, limit)
    return _parse(adapter, text), size


def _error(message: str, kind: str | None) -> dict:
    return {"type": "error", "message": message} | ({"kind": kind} if kind else {})


def close_frame(e: ProtocolError) -> CloseFrame:
    """What refuse() sends, for the websocket layer to send itself (uvicorn_shim.limit_pings:
    a ping frame refused where the app never sees it)."""
    return CloseFrame(close_code(e), str(e)[:120], json.dumps(_error(str(e), e.tag)))


async def refuse(ws: WebSocket, e: Refused, timeout: float = 5.0) -> None:
    """Closes the socket with the refusal's close code (web/errors.py WS_CLOSE), after its error
    message (with its tag, where it has one)."""
    await close(ws, close_code(e), str(e), timeout, kind=getattr(e, "tag", None))


async def close(ws: WebSocket, code: int, message: str, timeout: float = 5.0,
                kind: str | None = None) -> None:
    """The error message (with its `kind`, where given), then the close; a peer that does not
    take them in time is cut off."""
    try:
        await asyncio.wait_for(ws.send_json(_error(message, kind)), timeout)
        await asyncio.wait_for(ws.close(code=code, reason=message[:120]), timeout)
    except asyncio.TimeoutError:
        abort(ws)
    except Exception:  # the peer may already be gone
        pass
