"""Websocket telemetry: the training tab streams step records (metrics.Record); the server
validates them, commits them to the store (SQLite or PostgreSQL), acks, and fans what it
committed out to read-only viewers. A run's life around its trainer (telling viewers what the
run is now, marking it interrupted when its tab goes away) is the runs package's (runs/).

  protocol.py      the wire protocol: messages, parsing, size limits, close codes
  trainer.py       the trainer socket, /ws/runs/{id}
  viewer.py        the viewer socket, /ws/runs/{id}/watch
  uvicorn_shim.py  the one place that reaches into uvicorn's private websocket internals
"""

from fastapi import APIRouter

from andrea.telemetry import trainer, viewer
from andrea.telemetry.protocol import MAX_MESSAGE_BYTES, MAX_RECORDS, RECORDS_PER_MESSAGE

__all__ = ["MAX_MESSAGE_BYTES", "MAX_RECORDS", "RECORDS_PER_MESSAGE", "router"]

# Both sockets (app.create_app includes this one router).
router = APIRouter()
router.include_router(trainer.router)
router.include_router(viewer.router)
