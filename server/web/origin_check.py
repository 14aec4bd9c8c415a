"""State-changing HTTP (POST, PUT, PATCH, DELETE) from a page of another site is refused, as
the websockets refuse it (telemetry/protocol.py): a form or a `text/plain` fetch needs no CORS
preflight, so without this any page a participant opens could resume or delete runs through
their browser. Clients without an Origin (the CLI, curl, scripts) are no page and pass: the
token rules (deps.authorize) still apply to them."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from andrea.config import Settings, page_port

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def cross_site(headers: dict[bytes, bytes], settings: Settings,
               scheme: str = "http") -> str | None:
    """Why a request's headers say it comes from a page of another site; None: they do not.
    `scheme`: the request's (https behind a TLS proxy)."""
    origin = headers.get(b"origin")
    if origin is not None:
        origin_s = origin.decode("latin-1")
        port = page_port(headers.get(b"host", b"").decode("latin-1"), scheme)
        if not settings.origin_allowed(origin_s, port):
            return (f"a page of {origin_s[:100]!r} may not change anything on this server; "
                    "use its own pages, the CLI or the API without a browser")
    if headers.get(b"sec-fetch-site", b"").lower() == b"cross-site":
        return ("a page of another site may not change anything on this server (Sec-Fetch-Site: "
                "cross-site); use its own pages, the CLI or the API without a browser")
    return None


class OriginCheck:
    """403, with the reason as JSON `detail`, for a state-changing request from another site's
    page; everything else goes through untouched."""

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in STATE_CHANGING:
            why = cross_site(dict(scope["headers"]), self.settings, scope.get("scheme", "http"))
            if why:
                await JSONResponse({"detail": why}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
