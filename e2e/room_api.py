"""A room run trained through the API alone (no GPU): two workers that send small f32
pseudo-gradients and report set eval losses, for the tests of the pages that read rooms."""

from __future__ import annotations

import httpx
import numpy as np

from tests.small_model import SMALL
from tests.trainer_client import bearer


def a_room(url: str, lr: float | None = None, H: int = 2, rounds: int = 2,
           inner: bool = True) -> dict:
    """A room of two API workers that trained `rounds` rounds of H inner steps (batch 2 x 32
    tokens: 64 a step): eval losses 5.0/5.2, 4.6/4.8, 4.0/4.2 of versions 0, 1, 2, and (with
    `inner`) each worker's inner losses. -> the run."""
    run = httpx.post(f"{url}/api/runs", json={
        **SMALL, "steps": rounds * H, "batch_size": 2, "seed": 4,
        **({} if lr is None else {"lr": lr}),
        "room": {"inner_steps": H, "codec": "f32", "workers_per_address": 2}}).json()
    room_url = f"{url}/api/runs/{run['id']}/room"
    workers = [httpx.post(f"{room_url}/workers", headers=bearer(run["room"]["join_token"])).json()
               for _ in range(2)]
    numel = run["layout"]["total_numel"]
    for v, losses in enumerate(((5.0, 5.2), (4.6, 4.8), (4.0, 4.2))[:rounds + 1]):
        for w, loss in zip(workers, losses):
            steps = [] if v == rounds or not inner else [loss + 0.5 - 0.1 * s for s in range(H)]
            if v < rounds:
                r = httpx.post(f"{room_url}/deltas/{v}", headers=bearer(w["token"]),
                               content=np.full(numel, 1e-4, "<f4").tobytes())
                assert r.status_code == 200, r.text
            r = httpx.post(f"{room_url}/reports/{v}", headers=bearer(w["token"]),
                           json={"losses": steps, "eval_loss": loss})
            assert r.status_code == 204, r.text
    assert httpx.get(room_url).json()["finished"]
    return run
