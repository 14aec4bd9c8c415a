"""The source bandit over HTTP: an ad hoc run reports its per-source losses and is served the phases
they decide (the bandit itself: tests/unit/test_data_bandit.py)."""

from __future__ import annotations

from andrea.data import wire
from andrea.data.bandit import PhaseSchedule


def test_bandit_over_http(data_client):
    """Runs without a trainer socket (ad hoc ones) report losses over HTTP, keyed like a
    telemetry record's source_losses: by source index."""
    url = "/api/batches/{}?preset=tiny&seed=3&batch_size=8&mode=bandit"
    first = data_client.get(url.format(0))
    run = first.headers["x-andrea-run"]
    auth = {"authorization": f"Bearer {first.headers['x-andrea-token']}"}   # the run's token
    assert wire.decode(first.content).phase == 0
    phases = PhaseSchedule(3).phases_until(200)
    for step in range(150):
        r = data_client.post(f"/api/runs/{run}/source_losses", headers=auth,
                             json={"step": step, "losses": {"0": 3.0, "1": 5.0 * 0.99 ** step}})
        assert r.status_code == 200 and r.json()["used_by_bandit"]
    later = next(p for p in phases if p[1] >= 150)
    body = wire.decode(data_client.get(url.format(later[1])).content)
    assert body.phase == later[0]
    data = data_client.get(f"/api/runs/{run}/data").json()
    marks = data["phases"]
    assert [(m["index"], m["start"], m["length"]) for m in marks] == phases[:later[0] + 1]
    assert marks[-1]["weights"][1] > marks[-1]["weights"][0]
    for key in ("x", "9", "python-docs"):
        bad = data_client.post(f"/api/runs/{run}/source_losses", headers=auth,
                               json={"step": 1, "losses": {key: 1}})
        assert bad.status_code == 400 and "unknown sources" in bad.text, key
    assert data_client.post(f"/api/runs/{run}/source_losses", headers=auth,
                            json={"step": -1, "losses": {}}).status_code == 422
    assert data_client.post(f"/api/runs/{run}/source_losses",      # no token, no write
                            json={"step": 1, "losses": {"0": 1.0}}).status_code == 403
