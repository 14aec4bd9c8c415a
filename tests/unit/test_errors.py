"""The domain's refusals (andrea.errors) and their one mapping to the wire (web/errors.py): every
kind has its HTTP status and its websocket close code; a refusal raised under any route is
answered as FastAPI answers an HTTPException ({"detail": why}), with Retry-After where it gives
one, and a socket's refusal closes with its kind's code after its error message."""

import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.testclient import TestClient

from andrea.broker import BrokerUnavailable
from andrea.checkpoints import CheckpointError
from andrea.errors import CONFLICT, NOT_FOUND, TOO_LARGE, Refusal
from andrea.room.rounds import RoomError
from andrea.runs.lifecycle import RunBusy
from andrea.storage import DiskFull
from andrea.store import StoreUnavailable
from andrea.telemetry.protocol import BUSY, ProtocolError, refuse
from andrea.web.errors import HTTP_STATUS, WS_CLOSE, answer_refusals


def test_every_kind_has_one_status_and_a_close_code():
    assert set(HTTP_STATUS) == set(Refusal)
    assert len(set(HTTP_STATUS.values())) == len(Refusal)
    assert set(WS_CLOSE) == set(Refusal)
    # RFC 6455's registered codes, or the application's 4000-4999
    assert all(c in (1003, 1008, 1009, 1011, 1013) or 4000 <= c < 5000
               for c in WS_CLOSE.values())


def test_a_refusal_under_a_route_is_its_kinds_answer():
    app = FastAPI()
    answer_refusals(app)
    raised = {"room": RoomError(CONFLICT, "version 3 is not the one being trained"),
              "checkpoint": CheckpointError(NOT_FOUND, "run x has no checkpoint at step 9"),
              "disk": DiskFull("not enough disk space", 30),
              "store": StoreUnavailable("the server cannot write its database /d/a.sqlite"),
              "broker": BrokerUnavailable("cannot reach the broker redis://h:1"),
              "busy": RunBusy("a tab is training this run: stop it there first")}
    def route(e):
        def refuse():
            raise e
        return refuse

    for name, e in raised.items():
        app.get(f"/{name}")(route(e))
    c = TestClient(app)
    for name, status, retry in [("room", 409, None), ("checkpoint", 404, None),
                                ("disk", 507, "30"), ("store", 503, "10"), ("broker", 503, "10"),
                                ("busy", 409, None)]:
        r = c.get(f"/{name}")
        assert (r.status_code, r.json(), r.headers.get("retry-after")) == (
            status, {"detail": str(raised[name])}, retry)


def test_a_refusal_on_a_socket_closes_with_its_kinds_code_after_its_message():
    app = FastAPI()
    refusals = {"busy": ProtocolError(CONFLICT, "another trainer holds this run", BUSY),
                "big": ProtocolError(TOO_LARGE, "message of 9 bytes is over 8"),
                "store": StoreUnavailable("the server cannot use its database /d/a.sqlite")}

    @app.websocket("/ws/{name}")
    async def socket(ws: WebSocket, name: str):
        await ws.accept()
        await refuse(ws, refusals[name])

    c = TestClient(app)
    for name, code, kind in [("busy", 1008, BUSY), ("big", 1009, None), ("store", 1013, None)]:
        with c.websocket_connect(f"/ws/{name}") as ws:
            said = ws.receive_json()
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
        assert said == {"type": "error", "message": str(refusals[name])} | (
            {"kind": kind} if kind else {})
        assert closed.value.code == code
