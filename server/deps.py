"""Typed dependencies: how routes and websocket handlers get the app's objects. create_app
(app.py) makes each once and keeps it on app.state; handlers ask here, never app.state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.requests import HTTPConnection
from fastapi.templating import Jinja2Templates

from andrea.checkpoints import CheckpointStore
from andrea.config import Settings
from andrea.data.hub import DataHub
from andrea.data.runs import RunRegistry
from andrea.fanout import Fanout
from andrea.store import Store


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


async def get_existing_run(run_id: str, store: StoreDep) -> dict:
    """The stored run of the path's run_id, or 404."""
    run = await store.run(store.get_run, run_id)
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
    verdict = await store.run(store.check_token, run_id, token) if token else "wrong"
    if verdict == "revoked":
        raise HTTPException(403, REVOKED)
    if verdict != "ok":
        raise HTTPException(403, "wrong or missing write token")


async def get_written_run(run: RunDep, request: Request, store: StoreDep) -> dict:
    """The path's run, for a request that presents its write token (Authorization: Bearer)."""
    await check_write_token(store, run["id"], bearer(request))
    return run


WritableRunDep = Annotated[dict, Depends(get_written_run)]
