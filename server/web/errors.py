"""The one mapping from the domain's refusals (errors.py) to HTTP: a Refused error raised
anywhere under a route is answered with its kind's status and {"detail": why}, as FastAPI
answers an HTTPException, with Retry-After where the refusal gives one."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from andrea.errors import Refusal, Refused

HTTP_STATUS = {
    Refusal.MALFORMED: 400, Refusal.NOT_ALLOWED: 403, Refusal.NOT_FOUND: 404,
    Refusal.CONFLICT: 409, Refusal.GONE: 410, Refusal.INVALID: 422, Refusal.TOO_OFTEN: 429,
    Refusal.BROKEN: 500, Refusal.DISK_FULL: 507,
}


def http_status(e: Refused) -> int:
    return HTTP_STATUS[e.kind]


async def _refused(request: Request, e: Refused) -> JSONResponse:
    headers = {"Retry-After": str(e.retry_after_s)} if e.retry_after_s is not None else None
    return JSONResponse({"detail": str(e)}, status_code=http_status(e), headers=headers)


def answer_refusals(app: FastAPI) -> None:
    """Every route's Refused errors answered by HTTP_STATUS."""
    app.add_exception_handler(Refused, _refused)
