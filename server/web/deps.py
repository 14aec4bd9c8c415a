"""Typed dependencies: how routes and websocket handlers get the app's objects. create_app
(app.py) makes each once and keeps it on app.state; handlers ask here, never app.state. And who
may change a run: its write token, the operator's token, or (on a loopback-only server) the
machine's own user (authorize)."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.requests import HTTPConnection
from fastapi.templating import Jinja2Templates

from andrea.checkpoints import CheckpointStore
from andrea.config import LOOPBACK_HOSTS, Settings, host_of
from andrea.data.hub import DataHub
from andrea.data.run_registry import RunRegistry
from andrea.fanout import Fanout
from andrea.storage import StorageBudget
from andrea.store import Store
from andrea.web.quotas import MessageRates, RateLimiter


def _app_state(name: str):
    """A dependency: the object create_app keeps as app.state.<name>."""
    def get(conn: HTTPConnection):
        return getattr(conn.app.state, name)
    return Depends(get)


SettingsDep = Annotated[Settings, _app_state("settings")]
StoreDep = Annotated[Store, _app_state("store")]
DataDep = Annotated[DataHub, _app_state("data")]             # the corpus and its tokenizers
RunsDep = Annotated[RunRegistry, _app_state("runs")]         # batch specs and bandits
FanoutDep = Annotated[Fanout, _app_state("fanout")]          # live viewers and trainers
TemplatesDep = Annotated[Jinja2Templates, _app_state("templates")]
CheckpointsDep = Annotated[CheckpointStore, _app_state("checkpoints")]   # checkpoint files
RunLimiterDep = Annotated[RateLimiter, _app_state("run_limiter")]   # new runs per client
# The data dir's free space above its floor (storage.py), for every writer.
StorageDep = Annotated[StorageBudget, _app_state("storage")]
MessageRatesDep = Annotated[MessageRates, _app_state("message_rates")]  # trainer bytes/s


async def get_existing_run(run_id: str, store: StoreDep) -> dict:
    """The stored run of the path's run_id, or 404."""
    run = await store.run(store.runs.get, run_id)
    if run is None:
        raise HTTPException(404, f"unknown run {run_id!r}")
    return run


RunDep = Annotated[dict, Depends(get_existing_run)]


REVOKED = "this run was resumed elsewhere; this tab's token was revoked"


def bearer(request: HTTPConnection) -> str:
    """The token of an `Authorization: Bearer <token>` header; "" for anything else (a bare
    token, another scheme), which no run's token matches."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def check_write_token(store: Store, run_id: str, token: str) -> None:
    """403 unless `token` is the run's current write token (saying so when a resume revoked
    it). Checked again under the run lock where a resume could have come in between."""
    verdict = await store.run(store.runs.check_token, run_id, token) if token else "wrong"
    if verdict == "revoked":
        raise HTTPException(403, REVOKED)
    if verdict != "ok":
        raise HTTPException(403, "wrong or missing write token")


async def get_written_run(run: RunDep, request: Request, store: StoreDep) -> dict:
    """The path's run, for a request that presents its write token (Authorization: Bearer)."""
    await check_write_token(store, run["id"], bearer(request))
    return run


WritableRunDep = Annotated[dict, Depends(get_written_run)]


# ---- who may change a run --------------------------------------------------------------------
# A loopback-only server's own user may resume, rename, delete and branch any run without a
# token (the convenience of one person on one machine), and only a request that really is
# theirs counts (request_is_local). Every other request shows the run's write token or the
# operator's (ANDREA_ADMIN_TOKEN), checked before the run is even looked up: a request without
# one learns nothing about the run.

NO_TOKEN = ("this server needs the run's write token or the operator's token for this: send "
            "`Authorization: Bearer <token>` (the run page's \"Copy resume link\" carries the "
            "run's token; `andrea train --token`, ANDREA_TOKEN)")
WRONG_TOKEN = ("this token is not the run's write token nor the operator's: nothing was "
               "changed; use the run's resume link or ask the operator")


# Headers a proxy adds (or a client claims): a request that carries one was relayed for
# someone, and a proxy on this machine makes every participant's request come from loopback.
PROXY_HEADERS = frozenset({"forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip",
                           "x-forwarded-server", "via"})


def _loopback_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def request_is_local(conn: HTTPConnection, settings: Settings) -> bool:
    """A request from this machine's own user: the server trusts its local user
    (Settings.trusts_local_user: loopback-only, and no workshop names unless the operator asked
    with ANDREA_LOCAL_OWNER=1), the connection comes from a loopback address and no proxy
    header says it was relayed for another client, and the Host names a loopback host and the
    port this server listens on (what this machine's browser sends; a participant behind a
    proxy that passes Host through can claim `localhost`, not the proxy's headers away)."""
    if not settings.trusts_local_user:
        return False
    if any(name in PROXY_HEADERS for name in conn.headers.keys()):
        return False
    if not _loopback_address(conn.client.host if conn.client else ""):
        return False
    name, port = host_of(conn.headers.get("host", ""))
    server = conn.scope.get("server") or (None, None)
    default = 443 if conn.url.scheme in ("https", "wss") else 80
    return name in LOOPBACK_HOSTS and (port or default) == server[1]


def is_admin(settings: Settings, token: str) -> bool:
    """The operator's token (constant-time: a guess learns nothing from the time it takes)."""
    admin = settings.admin_token
    return bool(admin and token) and hmac.compare_digest(token.encode(), admin.encode())


async def authorize(conn: HTTPConnection, settings: Settings, store: Store, run_id: str,
                    local_ok: bool = True) -> None:
    """Nothing for the run's owner: a local request (when `local_ok`), the run's current write
    token or the operator's. Else 401 (no token) or 403 (a wrong or revoked one), the same for
    a run that does not exist."""
    if local_ok and request_is_local(conn, settings):
        return
    token = bearer(conn)
    if not token:
        raise HTTPException(401, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})
    if is_admin(settings, token):
        return
    verdict = await store.run(store.runs.check_token, run_id, token)
    if verdict == "revoked":
        raise HTTPException(403, REVOKED)
    if verdict != "ok":     # wrong, or no such run: the same answer
        raise HTTPException(403, WRONG_TOKEN)


async def get_owned_run(run_id: str, request: Request, settings: SettingsDep,
                        store: StoreDep) -> dict:
    """The path's run, for its owner (authorize first, then 404 for an unknown run)."""
    await authorize(request, settings, store, run_id)
    return await get_existing_run(run_id, store)


async def get_token_run(run_id: str, request: Request, settings: SettingsDep,
                        store: StoreDep) -> dict:
    """The path's run, for a request with its write token or the operator's, local or not
    (checkpoint reads: the training state is the token holder's alone)."""
    await authorize(request, settings, store, run_id, local_ok=False)
    return await get_existing_run(run_id, store)


OwnedRunDep = Annotated[dict, Depends(get_owned_run)]
TokenRunDep = Annotated[dict, Depends(get_token_run)]
