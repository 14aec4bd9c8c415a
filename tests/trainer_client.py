"""A test's own training tab: sends step records over a trainer socket (websockets' sync client)
the way the page does, each batch acknowledged before the next."""

from __future__ import annotations

import json
import time


def send_records(ws, first: int, last: int, per: int, record, pause: float, on_ack) -> None:
    """Records `first`..`last` (record(step) makes one) in batches of `per` over a socket that
    has said hello; `on_ack(step)` hears each acknowledged step; `pause` s between batches."""
    step = first
    while step <= last:
        batch = [record(s) for s in range(step, min(step + per, last + 1))]
        ws.send(json.dumps({"type": "metrics", "records": batch}))
        ack = json.loads(ws.recv(timeout=10))
        assert ack["type"] == "ack", ack
        on_ack(ack["step"])
        step = batch[-1]["step"] + 1
        time.sleep(pause)
