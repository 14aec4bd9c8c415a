"""The one mapping from the domain's refusals (errors.py) to the wire. HTTP: a Refused error
raised anywhere under a route is answered with its kind's status and {"detail": why}, as
FastAPI answers an HTTPException, with Retry-After where the refusal gives one. Websockets: a
socket that refuses closes with its kind's close code (WS_CLOSE), after an error message that
says why (telemetry/protocol.py close)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from andrea.errors import Refusal, Refused

HTTP_STATUS = {
    Refusal.MALFORMED: 400, Refusal.NOT_ALLOWED: 403, Refusal.NOT_FOUND: 404,
    Refusal.CONFLICT: 409, Refusal.GONE: 410, Refusal.TOO_LARGE: 413, Refusal.INVALID: 422,
    Refusal.TOO_OFTEN: 429, Refusal.BROKEN: 500, Refusal.UNAVAILABLE: 503,
    Refusal.DISK_FULL: 507,
}

# RFC 6455's codes where one fits: 1003 data the socket does not take, 1008 policy (a client
# takes these as final, telemetry.js: a token, another trainer, a rule of the run), 1009 too
# big, 1011 the server's fault, 1013 try again later (the trainer keeps its unacknowledged
# records and reconnects); 4507, the application's range, as HTTP's 507 (the trainer waits 30 s).
WS_CLOSE = {
    Refusal.MALFORMED: 1003, Refusal.INVALID: 1003, Refusal.NOT_ALLOWED: 1008,
    Refusal.NOT_FOUND: 1008, Refusal.CONFLICT: 1008, Refusal.GONE: 1008,
    Refusal.TOO_OFTEN: 1008, Refusal.TOO_LARGE: 1009, Refusal.BROKEN: 1011,
    Refusal.UNAVAILABLE: 1013, Refusal.DISK_FULL: 4507,
}


def http_status(e: Refused) -> int:
    return HTTP_STATUS[e.kind]


def close_code(e: Refused) -> int:
    return WS_CLOSE[e.kind]


async def _refused(request: Request, e: Refused) -> JSONResponse:
    headers = {"Retry-After": str(e.retry_after_s)} if e.retry_after_s is not None else None
    return JSONResponse({"detail": str(e)}, status_code=http_status(e), headers=headers)


def answer_refusals(app: FastAPI) -> None:
    """Every route's Refused errors answered by HTTP_STATUS."""
    app.add_exception_handler(Refused, _refused)
