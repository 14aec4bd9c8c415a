"""Liveness: the launcher and tests poll it until the server answers."""

import os

from fastapi import APIRouter

from andrea import __version__
from andrea.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok", version=__version__, pid=os.getpid())
