"""RunConfig is strict (run_config.py): a number is a JSON number, a switch a JSON boolean."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("bad", [{"steps": "100"}, {"steps": True}, {"steps": 100.0},
                                 {"clip": 1}, {"clip_mode": "sometimes"}, {"clip_mode": 1},
                                 {"clip_mode": None}, {"lr": "0.1"}, {"seed": False}])
def test_run_config_is_strict(client, bad):
    assert client.post("/api/runs", json={"preset": "tiny", **bad}).status_code == 422
