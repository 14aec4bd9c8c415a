"""The domain's refusals (andrea.errors) and their one HTTP mapping (web/errors.py): every kind
has its status, and a refusal raised under any route is answered as FastAPI answers an
HTTPException ({"detail": why}), with Retry-After where it gives one."""

from fastapi import FastAPI
from fastapi.testclient import TestClient

from andrea.checkpoints import CheckpointError
from andrea.errors import CONFLICT, NOT_FOUND, Refusal
from andrea.room.rounds import RoomError
from andrea.storage import DiskFull
from andrea.web.errors import HTTP_STATUS, answer_refusals


def test_every_kind_has_one_status():
    assert set(HTTP_STATUS) == set(Refusal)
    assert len(set(HTTP_STATUS.values())) == len(Refusal)


def test_a_refusal_under_a_route_is_its_kinds_answer():
    app = FastAPI()
    answer_refusals(app)
    raised = {"room": RoomError(CONFLICT, "version 3 is not the one being trained"),
              "checkpoint": CheckpointError(NOT_FOUND, "run x has no checkpoint at step 9"),
              "disk": DiskFull("not enough disk space", 30)}
    def route(e):
        def refuse():
            raise e
        return refuse

    for name, e in raised.items():
        app.get(f"/{name}")(route(e))
    c = TestClient(app)
    for name, status, retry in [("room", 409, None), ("checkpoint", 404, None),
                                ("disk", 507, "30")]:
        r = c.get(f"/{name}")
        assert (r.status_code, r.json(), r.headers.get("retry-after")) == (
            status, {"detail": str(raised[name])}, retry)
