"""The data routes' bounds (routes/data.py): source losses need the run's token, every request's
work is bounded (CPU time of the process), an ad hoc bandit costs little at its last step, and
bandit batches are the same after a server restart."""

from __future__ import annotations

import json
import time

import httpx
from websockets.sync.client import connect

from tests.trainer_client import (
    cpu_s,
    hello,
    new_run,
    record,
    ws_url,
)

# ---- no unauthenticated writes, bounded work -----------------------------------------------------


def test_source_losses_need_the_runs_token(client):
    run = new_run(client, data_mode="bandit")
    url = f"/api/runs/{run['id']}/source_losses"
    body = {"step": 1, "losses": {"0": 3.0}}
    assert client.post(url, json=body).status_code == 403
    assert client.post(url, json=body, headers={"authorization": run["token"]}).status_code \
        == 403                                                       # no bare tokens
    assert client.post(url, json=body, headers={"authorization": "Bearer nope"}).status_code \
        == 403
    ok = client.post(url, json=body, headers={"authorization": f"Bearer {run['token']}"})
    assert ok.status_code == 200, ok.text
    far = client.post(url, json={"step": 10**6, "losses": {}},
                      headers={"authorization": f"Bearer {run['token']}"})
    assert far.status_code == 400 and "beyond" in far.text
    # Ad hoc runs: the token comes with their batches.
    first = client.get("/api/batches/0?preset=tiny&seed=3&batch_size=2&mode=bandit")
    adhoc = first.headers["x-andrea-run"]
    url = f"/api/runs/{adhoc}/source_losses"
    assert client.post(url, json=body).status_code == 403
    assert client.post(url, json=body, headers={
        "authorization": f"Bearer {first.headers['x-andrea-token']}"}).status_code == 200
    # Bare tokens are refused for the other writes too.
    r = client.put(f"/api/runs/{run['id']}/weights", content=b"x",
                   headers={"authorization": run["token"]})
    assert r.status_code == 403


def test_requests_do_bounded_work(servers):
    """CPU time of the server for requests that used to cost seconds each: a bandit decided
    up to step 1e6, a tokenizer trained for any vocab size (only the sizes a run may have are
    built), a 64 MiB ad hoc batch."""
    proc, url, _ = servers()
    run = new_run(url, data_mode="bandit")
    token = {"authorization": f"Bearer {run['token']}"}
    httpx.get(url + "/api/corpus", timeout=60)                     # the corpus read once
    t0 = cpu_s(proc.pid)
    for path, status in [
        ("/api/batches/999999?preset=tiny&mode=bandit&steps=1000000", 400),
        ("/api/batches/0?preset=tiny&batch_size=4096&seq_len=4095", 400),
        ("/api/batches/0?preset=tiny&batch_size=2048", 400),
        ("/api/tokenizer/300", 404), ("/api/tokenizer/3000", 404),
        ("/api/corpus?vocab_size=1000", 400),
    ]:
        r = httpx.get(url + path, timeout=60)
        assert r.status_code == status, (path, r.text)
    r = httpx.post(f"{url}/api/runs/{run['id']}/source_losses", headers=token, timeout=60,
                   json={"step": 999_999, "losses": {"0": 1.0}})
    assert r.status_code == 400
    spent = cpu_s(proc.pid) - t0
    assert spent < 1.0, f"{spent:.2f} s of CPU"


def test_an_ad_hoc_bandit_costs_little_at_its_last_step(data_client):
    t0 = time.process_time()
    r = data_client.get("/api/batches/99999?preset=tiny&seed=9&batch_size=2&mode=bandit")
    assert r.status_code == 200
    assert time.process_time() - t0 < 1.5

# ---- bandit batches are the same after a restart -------------------------------------------------


def test_bandit_batches_survive_a_server_restart(servers, tmp_path):
    data = tmp_path / "data"
    earlier = servers(data)
    url = earlier.url
    run = new_run(url, steps=300, batch_size=2, data_mode="bandit")
    rid, step, before = run["id"], 0, {}
    with connect(ws_url(url, f"/ws/runs/{rid}")) as ws:
        hello(ws, run["token"])
        for phase in range(5):
            before[step] = httpx.get(f"{url}/api/runs/{rid}/batches/{step}", timeout=60).content
            info = httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"][-1]
            end = info["start"] + info["length"]
            ws.send(json.dumps({"type": "metrics", "records": [
                {**record(s + 1), "source_losses": {"0": 6.0 - 0.5 * phase, "1": 6.0}}
                for s in range(step, end)]}))
            assert json.loads(ws.recv(timeout=10))["type"] == "ack"
            step = end
    before[step] = httpx.get(f"{url}/api/runs/{rid}/batches/{step}", timeout=60).content
    phases = httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"]
    earlier.stop()
    url = servers(data).url
    # Its charts' phases before any batch is asked for (a finished run's page), then the
    # batches asked in another order than before: the same phases, the same bytes.
    assert httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"] == phases
    for s in sorted(before, reverse=True):
        got = httpx.get(f"{url}/api/runs/{rid}/batches/{s}", timeout=60).content
        assert got == before[s], s
    assert httpx.get(f"{url}/api/runs/{rid}/data", timeout=60).json()["phases"] == phases
