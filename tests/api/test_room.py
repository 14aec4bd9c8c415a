"""Room runs (server/room/): the codecs, the outer step against torch's SGD with Nesterov
momentum, rounds through the API (the robust mean, refusals, stale and duplicate deltas, who
may send), each worker's own batches, a restart mid-round, a crash mid-close, the deadline.
What hostile workers can and cannot do is tests/api/test_room_hostile.py's."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from andrea import durable
from andrea.app import create_app
from andrea.data import wire
from andrea.paths import room_dir
from andrea.room import codec, rounds
from andrea.room.init import seeded_weights
from andrea.room.outer import nesterov_step
from andrea.run_config import RoomConfig
from tests.conftest import LocalClient
from tests.trainer_client import bearer


def room_config(**room) -> dict:
    return {"preset": "tiny", "steps": 6, "batch_size": 2, "seed": 5,
            "room": {"inner_steps": 3, "codec": "f32", "max_workers": 8,
                     "workers_per_address": 8, **room}}


def create(client, **room) -> dict:
    r = client.post("/api/runs", json=room_config(**room))
    assert r.status_code == 201, r.text
    return r.json()


def join(client, run: dict) -> dict:
    r = client.post(f"/api/runs/{run['id']}/room/workers",
                    headers=bearer(run["room"]["join_token"]))
    assert r.status_code == 201, r.text
    return r.json()


def send(client, run: dict, worker: dict, version: int, delta: np.ndarray, name="f32"):
    return client.post(f"/api/runs/{run['id']}/room/deltas/{version}",
                       content=codec.encode(delta, name), headers=bearer(worker["token"]))


def weights(client, run: dict, version: int) -> np.ndarray:
    r = client.get(f"/api/runs/{run['id']}/room/weights/{version}")
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<f4").copy()


ROOM_DEFAULTS = RoomConfig()


def torch_outer(w0: np.ndarray, grads: list[np.ndarray], lr=ROOM_DEFAULTS.outer_lr,
                mu=ROOM_DEFAULTS.outer_momentum) -> np.ndarray:
    """torch's SGD as the room's outer step (momentum 0: plain SGD, torch's Nesterov wants
    momentum)."""
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.SGD([p], lr=lr, momentum=mu, nesterov=mu > 0)
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy()


def clipped_mean(deltas: list[np.ndarray], multiple: float = 2.0,
                 history: tuple = (), steps: list[int] | None = None) -> np.ndarray:
    """What a round averages, from the definition (aggregate.py's docstring) in float64: each
    delta clipped to `multiple` x the median of its round's and the history's norms; from 3
    deltas on, those whose score (their p-th highest cosine with another, p = the honest
    peers any minority leaves) is under half the median score dropped; the rest's mean,
    weighted by `steps` (each one's inner steps) where given."""
    steps = np.ones(len(deltas)) if steps is None else np.array(steps, np.float64)
    x = [d.astype(np.float64) for d in deltas]
    norms = [np.linalg.norm(d) for d in x]
    limit = multiple * np.median(norms + list(history))
    x = np.stack([d * min(1.0, limit / n) for d, n in zip(x, norms)])
    if len(x) >= 3:
        n = len(x)
        cos = np.array([[a @ b / np.linalg.norm(a) / np.linalg.norm(b) for b in x] for a in x])
        peers = n - 1 - (int(np.ceil(n / 2)) - 1)
        score = np.array([sorted(np.delete(cos[i], i), reverse=True)[peers - 1]
                          for i in range(n)])
        if np.median(score) > 0:
            keep = score >= 0.5 * np.median(score)
            x, steps = x[keep], steps[keep]
    return (steps @ x / steps.sum()).astype(np.float32)


@pytest.fixture
def app_client(settings):
    with LocalClient(create_app(settings)) as c:
        yield c


# ---- codecs and the outer step ---------------------------------------------------------------

def test_codecs_round_trip_within_their_precision_and_refuse_bad_bodies():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10_000) * np.exp(rng.standard_normal(10_000))).astype(np.float32)
    assert np.array_equal(codec.decode(codec.encode(x, "f32"), "f32", x.size), x)
    f16 = codec.decode(codec.encode(x, "f16"), "f16", x.size)
    assert np.all(np.abs(f16 - x) <= np.abs(x) * 2.0 ** -11 + 2.0 ** -24)
    body = codec.encode(x, "int8")
    assert len(body) == codec.payload_bytes("int8", x.size) == 4 * 40 + x.size
    q = codec.decode(body, "int8", x.size)
    scale = np.repeat(np.abs(np.pad(x, (0, 240))).reshape(-1, 256).max(1) / 127, 256)[:x.size]
    assert np.all(np.abs(q - x) <= scale / 2 * (1 + 1e-6))
    rel = np.linalg.norm(q - x) / np.linalg.norm(x)
    # Rounding to nearest leaves an error uniform over one step: RMS step / sqrt(12) (a code
    # that truncated would leave twice that).
    uniform = np.sqrt(np.mean(scale.astype(np.float64) ** 2) / 12) / np.sqrt(np.mean(x ** 2.0))
    print(f"\nint8 block-wise reconstruction: relative L2 error {rel:.2e} "
          f"(rounding's {uniform:.2e})")
    assert 0.8 * uniform < rel < 1.2 * uniform
    with pytest.raises(codec.DeltaRefused, match="bytes"):
        codec.decode(body[:-1], "int8", x.size)
    bad = x.copy()
    bad[7] = np.nan
    with pytest.raises(codec.DeltaRefused, match="not finite"):
        codec.decode(codec.encode(bad, "f32"), "f32", x.size)
    with pytest.raises(codec.DeltaRefused, match="not finite"):   # past f16's range: inf
        codec.decode(codec.encode(np.float32([1e6]), "f16"), "f16", 1)
    scales = np.frombuffer(body, "<f4", 40).copy()
    scales[3] = np.inf
    with pytest.raises(codec.DeltaRefused, match="scale"):
        codec.decode(scales.tobytes() + body[160:], "int8", x.size)


def test_the_outer_step_is_torch_sgd_with_nesterov_momentum():
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(5000).astype(np.float32)
    grads = [rng.standard_normal(5000).astype(np.float32) * 0.1 for _ in range(4)]
    for lr, mu in ((0.7, 0.9), (1.3, 0.5), (ROOM_DEFAULTS.outer_lr, ROOM_DEFAULTS.outer_momentum)):
        w, m = w0.copy(), np.zeros_like(w0)
        for i, g in enumerate(grads):
            nesterov_step(w, m, g, lr, mu, first=i == 0)
        np.testing.assert_allclose(w, torch_outer(w0, grads, lr, mu), rtol=1e-6, atol=1e-6)


# ---- rounds through the API ----------------------------------------------------------------

def test_a_round_takes_the_robust_mean_refuses_nans_and_steps_like_torch(app_client):
    c = app_client
    run = create(c)
    numel = run["layout"]["total_numel"]
    assert c.get(f"/api/runs/{run['id']}").json()["status"] == "running"
    workers = [join(c, run) for _ in range(5)]
    assert [w["slot"] for w in workers] == [0, 1, 2, 3, 4]
    assert workers[0]["version"] == 0            # the server's seeded init, nobody's upload
    w0 = weights(c, run, 0)
    assert np.array_equal(w0, seeded_weights(run["layout"], run["config"]["seed"]))

    rng = np.random.default_rng(3)
    mask = rounds.param_mask(run["layout"])
    honest = [(rng.standard_normal(numel) * 2e-4).astype(np.float32) * mask for _ in range(3)]
    big = honest[0] * 8              # within the AdamW bound, far past a typical norm
    bound = c.get(f"/api/runs/{run['id']}/room").json()["open"]["delta_bound"]
    assert np.abs(big).max() < bound
    for w, d in zip(workers[:3], honest):
        r = send(c, run, w, 0, d)
        assert r.status_code == 200 and r.json() == {"closed": False, "version": 0}, r.text
    assert send(c, run, workers[3], 0, big).json() == {"closed": False, "version": 0}
    nan = honest[1].copy()
    nan[123] = np.nan
    r = send(c, run, workers[4], 0, nan)      # the last to answer: the round closes without it
    assert r.status_code == 422 and "not finite" in r.json()["detail"]
    assert "closed" in r.json()["detail"]

    want = torch_outer(w0, [clipped_mean([*honest, big])])
    np.testing.assert_allclose(weights(c, run, 1), want, rtol=1e-6, atol=1e-7)
    room = c.get(f"/api/runs/{run['id']}/room").json()
    assert room["version"] == 1 and not room["finished"]
    last = room["closed"][-1]
    scales = {int(k): v["clip_scale"] for k, v in last["workers"].items()}
    assert scales[0] == scales[1] == scales[2] == 1.0 and scales[3] < 0.3
    assert list(last["refused"]) == ["4"] and last["rejected"] is None
    assert [w["bytes"] for w in room["workers"]] == [4 * numel] * 4 + [0]
    assert all("address" not in w and "token_sha256" not in w for w in room["workers"])
    # The next round trains version 1: a delta for 0 now is stale, dropped and counted.
    r = send(c, run, workers[0], 0, honest[0])
    assert r.status_code == 409 and "dropped" in r.json()["detail"]
    assert c.get(f"/api/runs/{run['id']}/room").json()["open"]["stale"] == 1
    # Round 1, the last (6 steps in rounds of 3): the run is finished after it. Its clip
    # reads the history: round 0's norms as they entered.
    for w, d in zip(workers, [*honest, honest[0], honest[1]]):
        assert send(c, run, w, 1, d).status_code == 200
    room = c.get(f"/api/runs/{run['id']}/room").json()
    assert room["version"] == 2 and room["finished"]
    history = [v["norm"] * v["clip_scale"] for v in last["workers"].values()]
    want = torch_outer(w0, [clipped_mean([*honest, big]),
                            clipped_mean([*honest, honest[0], honest[1]], history=history)])
    np.testing.assert_allclose(weights(c, run, 2), want, rtol=1e-5, atol=1e-7)
    assert c.get(f"/api/runs/{run['id']}").json()["status"] == "finished"
    assert c.post(f"/api/runs/{run['id']}/room/workers",
                  headers=bearer(run["room"]["join_token"])).status_code == 409
    # The exported model of a version is the room's global weights.
    assert c.get(f"/api/runs/{run['id']}/model.safetensors?step=2").status_code == 200


def test_an_int8_room_sends_each_version_as_an_int8_update_of_the_one_before(app_client):
    """A worker that holds version v takes v + 1 as v plus the update (a quarter of the bytes):
    the server's version is exactly that. The rounding is carried to the next update (error
    feedback): after any round the versions are the unquantized outer steps' sum (torch's) to
    within the last update's half code, not a walk of every round's rounding. Only the newest
    version is kept as an update; an f32 room keeps none."""
    c = app_client
    run = create(c, codec="int8", inner_steps=2, max_workers=2, workers_per_address=2)
    numel = run["layout"]["total_numel"]
    workers = [join(c, run) for _ in range(2)]
    rng = np.random.default_rng(4)
    mask = rounds.param_mask(run["layout"])
    w0 = held = weights(c, run, 0)
    assert c.get(f"/api/runs/{run['id']}/room/updates/0").status_code == 404
    steps = []
    for v in range(3):
        deltas = [(rng.standard_normal(numel) * 2e-4).astype(np.float32) * mask
                  for _ in workers]
        for w, d in zip(workers, deltas):
            assert send(c, run, w, v, d, "int8").status_code == 200
        r = c.get(f"/api/runs/{run['id']}/room/updates/{v + 1}")
        assert r.status_code == 200 and len(r.content) == codec.payload_bytes("int8", numel)
        assert len(r.content) < numel * 4 / 3.9
        version = weights(c, run, v + 1)
        assert np.array_equal(held + codec.int8_values(r.content, numel), version)  # bit for bit
        assert c.get(f"/api/runs/{run['id']}/room/updates/{v}").status_code == 404
        sent = [codec.decode(codec.encode(d, "int8"), "int8", numel) for d in deltas]
        steps.append(torch_outer(held, [clipped_mean(sent)]) - held)
        want = w0.astype(np.float64) + np.sum(steps, axis=0, dtype=np.float64)
        last = codec.int8_values(r.content, numel)     # this update's codes and scales
        scale = np.repeat(np.abs(np.pad(last, (0, -numel % 256))).reshape(-1, 256).max(1)
                          / 127, 256)[:numel]
        # (half a code of the last update, and the f32 sums': norm gains sit at 1.0)
        drift = np.abs(version - want)
        assert np.all(drift <= scale / 2 * (1 + 1e-3) + 4 * np.spacing(np.abs(version))), v
        held = version
    f32 = create(c, inner_steps=2, max_workers=1)
    worker = join(c, f32)
    assert send(c, f32, worker, 0, np.zeros(numel, np.float32)).status_code == 200
    assert c.get(f"/api/runs/{f32['id']}/room/updates/1").status_code == 404
    # Asked for what is not there: a version not made yet, one past any, a negative one, an
    # unknown run's, a plain run's. Nothing is made or changed by the asking.
    files = sorted(p.name for p in (room_path(c, run) / "updates").iterdir())
    plain = c.post("/api/runs", json={"preset": "tiny", "steps": 6}).json()
    for path, status in [(f"{run['id']}/room/updates/4", 404),
                         (f"{run['id']}/room/updates/{2 ** 31}", 422),
                         (f"{run['id']}/room/updates/-1", 422),
                         ("nosuchrun/room/updates/1", 404),
                         (f"{plain['id']}/room/updates/1", 404)]:
        assert c.get(f"/api/runs/{path}").status_code == status, path
    assert sorted(p.name for p in (room_path(c, run) / "updates").iterdir()) == files
    assert c.get(f"/api/runs/{run['id']}/room").json()["version"] == 3


def room_path(client, run: dict):
    return room_dir(client.app.state.settings.data_dir, run["id"])


def test_a_room_that_does_not_wait_for_the_slowest_cuts_its_round_and_weights_by_steps(
        app_client):
    """wait_for_slowest off: once half the workers (rounded up) sent a whole round, the round
    is cut (GET room says so) and the others send what they trained, each pseudo-gradient
    weighted by its steps in the mean; before the cut, and in a room that waits, a round of
    fewer steps is refused."""
    c = app_client
    run = create(c, wait_for_slowest=False)
    rid, numel = run["id"], run["layout"]["total_numel"]
    workers = [join(c, run) for _ in range(4)]
    rng = np.random.default_rng(7)
    common = rng.standard_normal(numel).astype(np.float32) * 1e-3
    mask = rounds.param_mask(run["layout"])            # (padding: the room keeps it zero)
    deltas = [(common + rng.standard_normal(numel).astype(np.float32) * 5e-4) * mask
              for _ in range(4)]

    def send_steps(w, d, steps, version=0):
        return c.post(f"/api/runs/{rid}/room/deltas/{version}?steps={steps}",
                      content=codec.encode(d, "f32"), headers=bearer(w["token"]))

    for bad in (0, 4):                                  # H is 3
        assert send_steps(workers[0], deltas[0], bad).status_code == 422
    r = send_steps(workers[3], deltas[3], 1)            # nobody is done: no cut yet
    assert r.status_code == 409 and "not cut" in r.json()["detail"]
    assert send(c, run, workers[0], 0, deltas[0]).status_code == 200
    assert not c.get(f"/api/runs/{rid}/room").json()["open"]["cut"]
    assert send_steps(workers[1], deltas[1], 3).status_code == 200   # 2 of 4: cut
    room = c.get(f"/api/runs/{rid}/room").json()
    assert room["open"]["cut"] and room["version"] == 0
    assert send_steps(workers[2], deltas[2], 2).status_code == 200
    assert send_steps(workers[3], deltas[3], 1).status_code == 200   # every one answered
    room = c.get(f"/api/runs/{rid}/room").json()
    assert room["version"] == 1 and not room["open"]["cut"]
    line = room["closed"][-1]
    assert [line["workers"][str(i)]["steps"] for i in range(4)] == [3, 3, 2, 1]
    assert line["cut_at"] is not None
    assert all(v["averaged"] for v in line["workers"].values())
    want = torch_outer(seeded_weights(run["layout"], 5), [clipped_mean(deltas, steps=[3, 3, 2, 1])])
    np.testing.assert_allclose(weights(c, run, 1), want, rtol=1e-6, atol=1e-7)

    waits = create(c)                                   # the default: every round is whole
    ws = [join(c, waits) for _ in range(2)]
    assert send(c, waits, ws[0], 0, deltas[0]).status_code == 200
    r = c.post(f"/api/runs/{waits['id']}/room/deltas/0?steps=1",
               content=codec.encode(deltas[1], "f32"), headers=bearer(ws[1]["token"]))
    assert r.status_code == 409 and "not cut" in r.json()["detail"]
    assert not c.get(f"/api/runs/{waits['id']}/room").json()["open"]["cut"]


def test_only_workers_send_and_only_what_the_model_takes(app_client):
    c = app_client
    run = create(c, max_workers=2)
    rid, numel = run["id"], run["layout"]["total_numel"]
    assert c.post(f"/api/runs/{rid}/room/workers",
                  headers=bearer("not-the-join-token")).status_code == 403
    assert c.post(f"/api/runs/{rid}/room/workers",
                  headers=bearer(run["token"])).status_code == 403   # the owner's token: no
    a, b = join(c, run), join(c, run)
    r = c.post(f"/api/runs/{rid}/room/workers", headers=bearer(run["room"]["join_token"]))
    assert r.status_code == 409 and "full" in r.json()["detail"]
    # Version 0 is the server's: nobody uploads one.
    assert c.put(f"/api/runs/{rid}/room/weights/0", content=bytes(4 * numel),
                 headers=bearer(a["token"])).status_code == 405
    d = np.zeros(numel, np.float32)
    assert c.post(f"/api/runs/{rid}/room/deltas/0", content=d.tobytes()).status_code == 403
    assert c.post(f"/api/runs/{rid}/room/deltas/0", content=d.tobytes() + b"1234",
                  headers=bearer(a["token"])).status_code == 413
    assert c.post(f"/api/runs/{rid}/room/deltas/0", content=d[:-1].tobytes(),
                  headers=bearer(a["token"])).status_code == 400
    assert send(c, run, a, 0, d).status_code == 200
    assert send(c, run, a, 0, d).status_code == 409                 # one per round
    # A worker's tab that reloads joins as that worker again: the same id and slot.
    r = c.post(f"/api/runs/{rid}/room/workers", headers={
        **bearer(run["room"]["join_token"]), "x-andrea-worker-token": b["token"]})
    assert r.status_code == 201 and (r.json()["worker"], r.json()["slot"]) == \
        (b["worker"], b["slot"])
    # A worker that leaves is out of the round (which then closes on the others) and its
    # token is refused from then on.
    assert c.delete(f"/api/runs/{rid}/room/workers", headers=bearer(b["token"])).status_code == 204
    assert send(c, run, b, 0, d).status_code == 403
    # The room is not the trainer socket's, nor resumed, nor given checkpoints by hand.
    assert c.post(f"/api/runs/{rid}/resume").status_code == 409
    assert c.put(f"/api/runs/{rid}/checkpoints/1", content=b"x",
                 headers=bearer(run["token"])).status_code == 409
    with c.websocket_connect(f"/ws/runs/{rid}") as ws:
        ws.send_json({"type": "hello", "token": run["token"]})
        msg = ws.receive_json()
        assert msg["type"] == "error" and "room" in msg["message"]
    # Reports: losses of a round, finite, at most inner_steps of them.
    url = f"/api/runs/{rid}/room/reports/0"
    assert c.post(url, json={"losses": [3.0, 2.9, 2.8], "eval_loss": 3.1},
                  headers=bearer(a["token"])).status_code == 204
    assert c.post(url, json={"losses": [1.0] * 4}, headers=bearer(a["token"])).status_code == 422
    assert c.post(url, json={"losses": [1.0]}).status_code == 403
    assert c.get(f"/api/runs/{rid}/room/reports").json()["reports"][0]["losses"] == [3.0, 2.9, 2.8]
    # A room run is not branched.
    assert c.post("/api/runs", json={"preset": "tiny", "steps": 6,
                                     "parent": {"run": rid, "step": 1}}).status_code == 409


def test_a_report_keeps_how_the_worker_spent_its_version(app_client):
    """A report's `timings` (ms waiting for the version, downloading, evaluating, training,
    sending: room_worker.js) are kept and read back with it; a report without them reads as
    before; a negative, non-finite, huge or unknown one is refused."""
    c = app_client
    run = create(c)
    rid = run["id"]
    a, b = join(c, run), join(c, run)
    url = f"/api/runs/{rid}/room/reports/0"
    timings = {"wait_ms": 0, "download_ms": 12.5, "eval_ms": 30.1, "train_ms": 950.0,
               "send_ms": 7.25}
    good = {"wait_ms": 1.0, "download_ms": 1.0, "eval_ms": 1.0, "train_ms": 1.0, "send_ms": 1.0}
    for bad in ({**good, "wait_ms": -1.0}, {**good, "train_ms": float("nan")},
                {**good, "send_ms": float("inf")}, {**good, "eval_ms": 2e9},
                {**good, "eval_ms": "1.0"}, {**good, "idle_ms": 1.0},
                {k: v for k, v in good.items() if k != "send_ms"}):
        r = c.post(url, content=json.dumps({"losses": [3.0], "timings": bad}),   # (NaN too)
                   headers={**bearer(a["token"]), "content-type": "application/json"})
        assert r.status_code == 422, bad
    assert c.post(url, json={"losses": [3.0, 2.9, 2.8], "eval_loss": 3.1, "timings": timings},
                  headers=bearer(a["token"])).status_code == 204
    assert c.post(url, json={"losses": [3.1], "eval_loss": 3.2},
                  headers=bearer(b["token"])).status_code == 204
    got = c.get(f"/api/runs/{rid}/room/reports").json()["reports"]
    assert got[0]["timings"] == {k: float(v) for k, v in timings.items()}
    assert "timings" not in got[1] and got[1]["losses"] == [3.1]


def test_each_worker_slot_draws_its_own_batches_again_at_every_rerun(app_client):
    c = app_client
    run = create(c)
    url = run["room"]["batches"]

    def batch(version, slot, step):
        r = c.get(url.format(version=version, slot=slot, step=step))
        assert r.status_code == 200, r.text
        return wire.decode(r.content).tokens.tobytes()

    seen = {(v, s, i): batch(v, s, i) for v in range(2) for s in range(3) for i in range(3)}
    assert len(set(seen.values())) == len(seen)
    assert batch(1, 2, 1) == seen[(1, 2, 1)]
    for bad in ((2, 0, 0), (0, 8, 0), (0, 0, 3)):     # rounds, slots, inner steps
        assert c.get(url.format(version=bad[0], slot=bad[1], step=bad[2])).status_code == 400
    # The plain batch route's index of (round 1, slot 2, step 1) is the same batch.
    step = (1 * 8 + 2) * 3 + 1
    assert c.get(f"/api/runs/{run['id']}/batches/{step}").content[40:] != b""
    assert wire.decode(c.get(f"/api/runs/{run['id']}/batches/{step}").content).tokens.tobytes() \
        == seen[(1, 2, 1)]


@pytest.mark.parametrize("name", ["f32", "int8"])
def test_a_restart_mid_round_and_a_crash_mid_close_lose_nothing(settings, monkeypatch, name):
    with LocalClient(create_app(settings)) as c:
        run = create(c, codec=name)
        numel = run["layout"]["total_numel"]
        ws = [join(c, run) for _ in range(3)]
        w0 = weights(c, run, 0)
        rng = np.random.default_rng(5)
        mask = rounds.param_mask(run["layout"])
        ds = [(rng.standard_normal(numel) * 1e-3).astype(np.float32) * mask for _ in range(3)]
        for w, d in zip(ws[:2], ds):
            assert send(c, run, w, 0, d, name).json()["closed"] is False
    # The server stops with two of three pseudo-gradients in; the next one has them. Its last
    # close dies after committing version 1 and before the room's state says so.
    real_save = rounds.Room._save
    calls = []

    def crash_once(self, st):
        if st["version"] == 1 and not calls:
            calls.append(1)
            raise OSError("killed mid-close")
        real_save(self, st)
    monkeypatch.setattr(rounds.Room, "_save", crash_once)
    with LocalClient(create_app(settings), raise_server_exceptions=False) as c:
        assert c.get(f"/api/runs/{run['id']}/room").json()["open"]["received"] == [0, 1]
        assert send(c, run, ws[2], 0, ds[2], name).status_code == 500
    monkeypatch.setattr(rounds.Room, "_save", real_save)
    with LocalClient(create_app(settings)) as c:
        room = c.get(f"/api/runs/{run['id']}/room").json()
        assert room["version"] == 1 and room["open"]["received"] == []
        assert [r["round"] for r in room["closed"]] == [0]
        if name == "f32":
            np.testing.assert_allclose(weights(c, run, 1), torch_outer(w0, [clipped_mean(ds)]),
                                       rtol=1e-6, atol=1e-7)
        else:       # the redone close made its version and its update again, as one
            update = c.get(f"/api/runs/{run['id']}/room/updates/1").content
            assert np.array_equal(weights(c, run, 1), w0 + codec.int8_values(update, numel))
            sent = [codec.decode(codec.encode(d, "int8"), "int8", numel) for d in ds]
            np.testing.assert_allclose(weights(c, run, 1), torch_outer(w0, [clipped_mean(sent)]),
                                       rtol=0, atol=2e-5)


def one_round(client, **room) -> dict:
    r = client.post("/api/runs", json={**room_config(**room), "steps": 3})   # inner_steps 3
    assert r.status_code == 201, r.text
    return r.json()


def status(client, run: dict) -> str:
    return client.get(f"/api/runs/{run['id']}").json()["status"]


def test_the_last_round_finishes_its_run_however_it_closes(app_client):
    """Closed by a refused pseudo-gradient (the last answer it waited for: not finite, or a
    finite one too large to square in f32, once accepted with an infinite norm that failed
    telling the viewer) while a viewer watches: the run is finished either way."""
    c = app_client
    for last in ("refused", "huge"):
        run = one_round(c)
        numel = run["layout"]["total_numel"]
        a, b = join(c, run), join(c, run)
        with c.websocket_connect(f"/ws/runs/{run['id']}/watch") as viewer:
            assert viewer.receive_json()["type"] == "run"
            assert send(c, run, a, 0, np.full(numel, 1e-3, np.float32)).status_code == 200
            delta = np.zeros(numel, np.float32)
            delta[0] = np.nan if last == "refused" else 1e20
            r = send(c, run, b, 0, delta)
            assert r.status_code == 422, r.text
            assert c.get(f"/api/runs/{run['id']}/room").json()["finished"] is True
            assert status(c, run) == "finished", last


def test_a_stop_mid_close_is_finished_at_the_next_start_with_one_checkpoint_kept(
        settings, monkeypatch):
    """Killed after version 1's commit and before the room's state says so: the next start
    finishes the close (from version 0, kept whatever checkpoints_kept says), the run with it,
    and removes the round's pseudo-gradients."""
    settings = settings.model_copy(update={"checkpoints_kept": 1})
    with LocalClient(create_app(settings)) as c:
        run = one_round(c)
        numel = run["layout"]["total_numel"]
        a, b = join(c, run), join(c, run)
        assert send(c, run, a, 0, np.full(numel, 1e-3, np.float32)).status_code == 200
    real_save = rounds.Room._save

    def killed_mid_close(self, st):
        if st["version"] == 1:
            raise OSError("killed mid-close")
        real_save(self, st)
    monkeypatch.setattr(rounds.Room, "_save", killed_mid_close)
    with LocalClient(create_app(settings), raise_server_exceptions=False) as c:
        assert send(c, run, b, 0, np.full(numel, 2e-3, np.float32)).status_code == 500
    monkeypatch.setattr(rounds.Room, "_save", real_save)
    with LocalClient(create_app(settings)) as c:
        room = c.get(f"/api/runs/{run['id']}/room").json()
        assert (room["version"], room["finished"], status(c, run)) == (1, True, "finished")
        assert not list((settings.data_dir / "runs" / run["id"] / "room").glob("deltas/*/*"))


def test_a_stop_mid_leave_strands_no_round(settings, monkeypatch):
    """The leave's state is saved before its pseudo-gradient's file goes: a stop between them
    leaves a stray file, not a round that lists a file it no longer has (no close could read
    it, ever)."""
    with LocalClient(create_app(settings)) as c:
        run = create(c)
        numel = run["layout"]["total_numel"]
        a, b, d = join(c, run), join(c, run), join(c, run)
        assert send(c, run, a, 0, np.full(numel, 1e-3, np.float32)).status_code == 200

    def killed(self, version, wid):
        raise OSError("killed mid-leave")
    monkeypatch.setattr(rounds.Room, "_discard_delta", killed)
    with LocalClient(create_app(settings), raise_server_exceptions=False) as c:
        assert c.delete(f"/api/runs/{run['id']}/room/workers",
                        headers=bearer(a["token"])).status_code == 500
    monkeypatch.undo()
    with LocalClient(create_app(settings)) as c:
        assert c.get(f"/api/runs/{run['id']}/room").json()["open"]["received"] == []
        assert send(c, run, b, 0, np.full(numel, 2e-3, np.float32)).json()["closed"] is False
        assert send(c, run, d, 0, np.full(numel, 3e-3, np.float32)).json()["closed"] is True


def test_a_round_goes_on_without_the_workers_that_left_or_went_silent(app_client):
    """A leave takes its pseudo-gradient out of the round and the deadline counts from the
    first one still in it; a worker refused may send a good one; a worker that sent nothing
    since it joined leaves a round deadline after it joined; and one that sent before leaves
    past missed_rounds deadlines of sending nothing, so that a quorum out of reach (their
    tabs gone) does not hold the room, and its slots, for good."""
    c = app_client
    run = create(c, quorum=2, round_deadline_s=1000, missed_rounds=2)
    numel = run["layout"]["total_numel"]
    a, b, d = join(c, run), join(c, run), join(c, run)
    assert send(c, run, a, 0, np.full(numel, 1e-3, np.float32)).status_code == 200
    assert c.delete(f"/api/runs/{run['id']}/room/workers",
                    headers=bearer(a["token"])).status_code == 204
    assert c.get(f"/api/runs/{run['id']}/room").json()["open"]["first_at"] is None
    bad = np.zeros(numel, np.float32)
    bad[3] = np.inf
    assert send(c, run, b, 0, bad).status_code == 422
    r = send(c, run, b, 0, np.full(numel, 2e-3, np.float32))
    assert r.json() == {"closed": False, "version": 0}          # d has not answered, quorum 2
    room = rounds_room(c, run)
    joined = {w["worker"]: w for w in c.get(f"/api/runs/{run['id']}/room").json()["workers"]}
    d_at = joined[d["worker"]]["joined"]
    assert room.drop_silent(d_at + 999) == [] and room.close_if_due(d_at + 999) is None
    assert room.drop_silent(d_at + 1001) == [str(d["worker"])]  # silent since it joined
    assert room.close_if_due(d_at + 1001) is not None           # b's closes the round
    # Round 1: e sends; b, which sent before, has missed_rounds deadlines of sending nothing.
    e = join(c, run)
    assert send(c, run, e, 1, np.full(numel, 1e-3, np.float32)).json()["closed"] is False
    first_at = c.get(f"/api/runs/{run['id']}/room").json()["open"]["first_at"]
    assert room.drop_silent(first_at + 1999) == []
    assert room.drop_silent(first_at + 2001) == [str(b["worker"])]
    assert room.close_if_due(first_at + 2001) is not None
    workers = {w["worker"]: w for w in c.get(f"/api/runs/{run['id']}/room").json()["workers"]}
    assert workers[d["worker"]]["left"] is not None and workers[b["worker"]]["left"] is not None
    assert workers[e["worker"]]["left"] is None


def test_a_leave_that_leaves_every_worker_answered_closes_the_round_at_once(app_client):
    """Two of three sent; the third's tab closes (its page leaves, or the owner removes it):
    the round closes then, on the two, not at the deadline or the next sweep."""
    c = app_client
    for how in ("leave", "remove"):
        run = create(c, round_deadline_s=1000)
        numel = run["layout"]["total_numel"]
        a, b, gone = join(c, run), join(c, run), join(c, run)
        w0 = weights(c, run, 0)
        mask = rounds.param_mask(run["layout"])      # (the layout's padding is no parameter)
        da, db = (np.full(numel, x, np.float32) * mask for x in (1e-3, 2e-3))
        assert send(c, run, a, 0, da).json()["closed"] is False
        assert send(c, run, b, 0, db).json()["closed"] is False      # waits for the third
        url = (f"/api/runs/{run['id']}/room/workers" if how == "leave"
               else f"/api/runs/{run['id']}/room/workers/{gone['worker']}")
        assert c.delete(url, headers=bearer(gone["token"])).status_code == 204
        room = c.get(f"/api/runs/{run['id']}/room").json()
        assert room["version"] == 1, how
        assert sorted(room["closed"][-1]["workers"]) == sorted([str(a["worker"]),
                                                                 str(b["worker"])])
        np.testing.assert_allclose(weights(c, run, 1), torch_outer(w0, [clipped_mean([da, db])]),
                                   rtol=1e-6, atol=1e-7)


def rounds_room(client, run: dict) -> rounds.Room:
    from andrea.room.lifecycle import room_of_run

    stored = client.app.state.store.runs.get(run["id"])
    return room_of_run(client.app.state.checkpoints, stored)


def test_what_a_room_takes_is_bounded(app_client, monkeypatch):
    """A body is written only for a worker's token; a finished room takes no pseudo-gradient;
    reports are one per worker and version; joins are workers_per_address a round per
    address."""
    from andrea.routes import room as room_routes

    c = app_client
    run = one_round(c, max_workers=2)
    numel = run["layout"]["total_numel"]
    a = join(c, run)
    written = []
    real = room_routes.temp_file
    monkeypatch.setattr(room_routes, "temp_file", lambda folder: written.append(1) or real(folder))
    r = c.post(f"/api/runs/{run['id']}/room/deltas/0", content=bytes(4 * numel))
    assert r.status_code == 403 and written == []
    url = f"/api/runs/{run['id']}/room/reports/0"
    codes = [c.post(url, json={"losses": [1.0], "eval_loss": 2.0},
                    headers=bearer(a["token"])).status_code for _ in range(4)]
    assert codes == [204, 409, 409, 409]
    assert send(c, run, a, 0, np.full(numel, 1e-3, np.float32)).json()["closed"] is True
    assert send(c, run, a, 1, np.full(numel, 1e-3, np.float32)).status_code == 409   # finished
    other = create(c, max_workers=1, workers_per_address=1)
    for _ in range(3):      # rounds (2) + 1 joins of workers_per_address 1, each then leaving
        w = join(c, other)
        assert c.delete(f"/api/runs/{other['id']}/room/workers",
                        headers=bearer(w["token"])).status_code == 204
    r = c.post(f"/api/runs/{other['id']}/room/workers", headers=bearer(other["room"]["join_token"]))
    assert r.status_code == 409 and "3 times" in r.json()["detail"]


def test_a_line_torn_by_a_crash_costs_only_itself(tmp_path):
    """rounds.jsonl and reports.jsonl after a machine crash mid-write: the torn line (cut JSON,
    cut UTF-8) is skipped, and the lines appended after it are read (they were once appended to
    the torn line, and the reader stopped there: every later round was lost)."""
    path = tmp_path / "rounds.jsonl"
    durable.append_line(path, {"round": 0})
    with open(path, "ab") as f:
        f.write('{"round": 1, "note": "é'.encode()[:-1])
    durable.append_line(path, {"round": 1})       # the close redone after the restart
    durable.append_line(path, {"round": 2})
    assert durable.read_lines(path) == [{"round": 0}, {"round": 1}, {"round": 2}]
    assert durable.read_lines(tmp_path / "none.jsonl") == []


def test_a_round_closes_at_its_deadline_with_a_quorum(app_client):
    c = app_client
    run = create(c, quorum=1, round_deadline_s=0.1)
    a, _ = join(c, run), join(c, run)            # the second never sends
    assert send(c, run, a, 0, np.zeros(run["layout"]["total_numel"], np.float32)).json() == \
        {"closed": False, "version": 0}
    deadline = time.monotonic() + 30           # the app's sweep runs every few seconds
    while c.get(f"/api/runs/{run['id']}/room").json()["version"] != 1:
        assert time.monotonic() < deadline, "the sweep never closed the round"
        time.sleep(0.2)


def test_a_models_weights_and_pseudo_gradients_pass_the_body_limit(tmp_path):
    """A pseudo-gradient is a sized upload (web/limits.py): a server whose JSON bodies may be
    64 KiB still takes one of 560 KB, exactly the model's size."""
    from andrea.config import Settings

    settings = Settings(data_dir=tmp_path / "data", max_body_bytes=64 << 10)
    with LocalClient(create_app(settings)) as c:
        run = create(c)
        w = join(c, run)
        numel = run["layout"]["total_numel"]
        assert 4 * numel > settings.max_body_bytes
        assert send(c, run, w, 0, np.zeros(numel, np.float32)).status_code == 200
        r = c.post(f"/api/runs/{run['id']}/room/reports/0", json={"losses": [1.0] * 100_000},
                   headers=bearer(w["token"]))
        assert r.status_code == 413              # a report is JSON: the limit holds


# ---- what the room's page and the runs list read -------------------------------------------

def progress(client, run: dict, worker: dict, version: int, step: int):
    return client.post(f"/api/runs/{run['id']}/room/progress/{version}", json={"step": step},
                       headers=bearer(worker["token"]))


def test_the_room_says_what_each_worker_does_and_what_its_round_waits_for(app_client):
    """Each worker's state (training step k of H, sending, waiting, refused, starting, left,
    done), the open round's `waiting_for` and whether its quorum is in, and the server's clock
    to count its deadline down by; a worker that left comes back by its worker token."""
    c = app_client
    run = create(c, quorum=2, round_deadline_s=1000)        # inner_steps 3, 2 rounds
    rid, numel = run["id"], run["layout"]["total_numel"]
    a, b, d = join(c, run), join(c, run), join(c, run)

    def room():
        return c.get(f"/api/runs/{rid}/room").json()

    def states():
        return {w["worker"]: (w["state"], w["step"]) for w in room()["workers"]}
    assert set(states().values()) == {("starting", None)}
    assert progress(c, run, a, 0, 2).status_code == 204
    assert progress(c, run, b, 0, 3).status_code == 204
    assert states() == {a["worker"]: ("training", 2), b["worker"]: ("sending", 3),
                        d["worker"]: ("starting", None)}
    # What a progress may say: the version trained now, a step of its round, a worker's token.
    assert progress(c, run, a, 1, 1).status_code == 409
    assert progress(c, run, a, 0, 4).status_code == 422
    assert c.post(f"/api/runs/{rid}/room/progress/0", json={"step": 1}).status_code == 403
    assert c.post(f"/api/runs/{rid}/room/progress/0", json={"step": "1"},
                  headers=bearer(a["token"])).status_code == 422
    before = room()
    assert before["open"]["waiting_for"] == sorted([a["worker"], b["worker"], d["worker"]])
    assert before["open"]["deadline_at"] is None and not before["open"]["quorum_met"]
    assert abs(before["now"] - time.time()) < 60
    assert send(c, run, b, 0, np.full(numel, 1e-3, np.float32)).json()["closed"] is False
    now = room()
    assert states()[b["worker"]] == ("waiting", 3)
    assert now["open"]["waiting_for"] == sorted([a["worker"], d["worker"]])
    assert not now["open"]["quorum_met"]                       # 1 of the 2 it needs
    assert now["open"]["deadline_at"] == now["open"]["first_at"] + 1000
    # d leaves, and comes back by its worker token: the same worker, starting again (what it
    # told before it left is not what it does now).
    assert progress(c, run, d, 0, 1).status_code == 204
    assert c.delete(f"/api/runs/{rid}/room/workers", headers=bearer(d["token"])).status_code == 204
    assert states()[d["worker"]] == ("left", None)
    assert room()["open"]["waiting_for"] == [a["worker"]]
    r = c.post(f"/api/runs/{rid}/room/workers", headers={
        **bearer(run["room"]["join_token"]), "x-andrea-worker-token": d["token"]})
    assert r.status_code == 201 and r.json()["worker"] == d["worker"] and r.json()["rejoined"]
    assert states()[d["worker"]] == ("starting", None)
    assert room()["open"]["waiting_for"] == sorted([a["worker"], d["worker"]])
    bad = np.zeros(numel, np.float32)
    bad[0] = np.nan
    assert send(c, run, a, 0, bad).status_code == 422
    assert states()[a["worker"]] == ("refused", None)
    assert room()["open"]["waiting_for"] == [d["worker"]]
    for w in (a, d):
        assert send(c, run, w, 0, np.full(numel, 1e-3, np.float32)).status_code == 200
    assert room()["version"] == 1 and room()["open"]["quorum_met"] is False
    assert set(states().values()) == {("starting", None)}      # a new round: nothing told yet
    for w in (a, b, d):
        send(c, run, w, 1, np.full(numel, 1e-3, np.float32))
    assert room()["finished"] and set(states().values()) == {("done", None)}


def test_an_overlapped_worker_that_sent_its_round_says_it_trains_the_next(app_client):
    """Overlapped (room overlap on), a worker that sent version v's pseudo-gradient trains
    round v + 1 while v closes: its progress on v + 1 is taken, and the room shows it `ahead`
    with its step; never further ahead, and never in a room that is not overlapped."""
    c = app_client
    run = create(c, overlap=True)                            # inner_steps 3, 2 rounds
    a, b = join(c, run), join(c, run)
    numel = run["layout"]["total_numel"]

    def states():
        return {w["worker"]: (w["state"], w["step"])
                for w in c.get(f"/api/runs/{run['id']}/room").json()["workers"]}
    assert send(c, run, a, 0, np.full(numel, 1e-3, np.float32)).json()["closed"] is False
    assert states()[a["worker"]] == ("waiting", 3)
    assert progress(c, run, a, 1, 2).status_code == 204
    assert progress(c, run, a, 2, 1).status_code == 409
    assert progress(c, run, b, 0, 1).status_code == 204
    assert states() == {a["worker"]: ("ahead", 2), b["worker"]: ("training", 1)}
    assert send(c, run, b, 0, np.full(numel, 1e-3, np.float32)).json()["closed"] is True
    assert states() == {a["worker"]: ("training", 2), b["worker"]: ("starting", None)}
    plain = create(c)
    w = join(c, plain)
    send(c, plain, w, 0, np.full(numel, 1e-3, np.float32))
    assert progress(c, plain, w, 2, 1).status_code == 409   # (it closed alone: now version 1)
    # The setting is a JSON boolean: anything else is refused, and no run is made.
    runs = len(c.get("/api/runs").json())
    for bad in ("yes", "true", 1, None, [True]):
        r = c.post("/api/runs", json=room_config(overlap=bad))
        assert r.status_code == 422 and "overlap" in r.text, (bad, r.text)
    assert len(c.get("/api/runs").json()) == runs


def test_the_runs_list_shows_a_room_in_rounds_with_its_global_eval_loss(app_client):
    """GET /api/runs: a room run's `room` says its rounds closed of all, its workers now (none
    once it finished) and its last and best global eval loss; a one-browser run has none."""
    c = app_client
    run = create(c)                                          # 6 steps in rounds of 3: 2 rounds
    plain = c.post("/api/runs", json={"preset": "tiny", "steps": 4}).json()
    numel = run["layout"]["total_numel"]

    def listed():
        return {r["id"]: r for r in c.get("/api/runs").json()}
    assert listed()[plain["id"]]["room"] is None
    assert listed()[run["id"]]["room"] == {
        "version": 0, "rounds": 2, "finished": False, "training": 0, "joined": 0,
        "eval_loss": None, "eval_version": None, "best_eval_loss": None, "elapsed_s": None}
    a, b = join(c, run), join(c, run)
    for w, loss in ((a, 5.0), (b, 5.2)):
        assert c.post(f"/api/runs/{run['id']}/room/reports/0", json={"losses": [],
                      "eval_loss": loss}, headers=bearer(w["token"])).status_code == 204
        send(c, run, w, 0, np.full(numel, 1e-3, np.float32))
    line = listed()[run["id"]]["room"]
    assert (line["version"], line["training"], line["joined"]) == (1, 2, 2)
    # (the median of two: their mean)
    assert (line["eval_loss"], line["eval_version"], line["best_eval_loss"]) == (5.1, 0, 5.1)
    for w, loss in ((a, 4.0), (b, 4.5)):
        c.post(f"/api/runs/{run['id']}/room/reports/1", json={"losses": [], "eval_loss": loss},
               headers=bearer(w["token"]))
        send(c, run, w, 1, np.full(numel, 1e-3, np.float32))
    line = listed()[run["id"]]["room"]
    assert line["finished"] and (line["version"], line["training"], line["joined"]) == (2, 0, 2)
    assert (line["eval_loss"], line["eval_version"], line["best_eval_loss"]) == (4.25, 1, 4.25)
    room = c.get(f"/api/runs/{run['id']}/room").json()     # its time: first join to last close
    first = min(w["joined"] for w in room["workers"])
    assert line["elapsed_s"] == pytest.approx(room["closed"][-1]["closed_at"] - first)
    assert listed()[run["id"]]["status"] == "finished"


def test_every_room_setting_has_its_words_on_the_form_and_in_the_help(app_client):
    """RoomConfig's descriptions are the one place for a room setting's words: the new-run form
    shows each (an input named room.<field> and its sentence), `andrea train --help` too."""
    from markupsafe import escape

    from andrea.cli.train_args import room_help
    from andrea.run_config import RoomConfig

    fields = RoomConfig.model_json_schema()["properties"]
    assert len(fields) == 12
    for name, prop in fields.items():
        assert len(prop.get("description", "")) > 20, name
    helped = " ".join(room_help().split())
    page = app_client.get("/").text
    for name, prop in fields.items():
        assert f"{name} {' '.join(prop['description'].split())}" in helped, name
        assert f'name="room.{name}"' in page, name
        assert f'<small class="field-hint">{escape(prop["description"])}</small>' in page, name


def test_the_room_page_finds_its_lone_tab_by_shape_batch_optimizer_and_lr(settings):
    """GET .../room/lone: the newest single run (no room, no parent) of the room's model shape,
    batch, context, optimizer and lr, one that started or may still start; null (and why)
    without one, with the config POST /api/runs takes to make one: the room's, less its room,
    its steps and seed kept."""
    def lone(c, run):
        r = c.get(f"/api/runs/{run['id']}/room/lone")
        assert r.status_code == 200, r.text
        return r.json()

    def single(c, **cfg):
        r = c.post("/api/runs", json={"preset": "tiny", "steps": 6, "batch_size": 2, "seed": 5,
                                      **cfg})
        assert r.status_code == 201, r.text
        return r.json()

    with LocalClient(create_app(settings)) as c:
        room = create(c)
        got = lone(c, room)
        assert got["run"] is None and got["name"] is None
        assert "no single run" in got["why"] and "batch 2 x 64 tokens" in got["why"]
        assert "room" not in got["config"] and "corpus_hash" not in got["config"]
        assert {k: got["config"][k] for k in ("steps", "seed", "batch_size", "preset")} == \
            {"steps": 6, "seed": 5, "batch_size": 2, "preset": "tiny"}
        made = c.post("/api/runs", json=got["config"])          # what the page's button does
        assert made.status_code == 201, made.text
        made = made.json()
        assert made["config"]["room"] is None and made["room"] is None
        same = {k: v for k, v in room["config"].items() if k not in ("room", "corpus_hash")}
        assert {k: v for k, v in made["config"].items()
                if k not in ("room", "corpus_hash")} == same
        assert lone(c, room)["run"] == made["id"]               # (made a moment ago: it starts)
        # Newer runs that train anything else are not it: another batch, context, width,
        # vocabulary, optimizer or lr, a room of the same shape, a run of another room.
        for other in ({"batch_size": 4}, {"seq_len": 128}, {"n_embd": 32, "n_head": 2},
                      {"vocab_size": 1024}, {"optimizer": "adamw_8bit"}, {"lr": 1e-3}):
            single(c, **other)
        create(c)
        assert lone(c, room)["run"] == made["id"]
        assert lone(c, room)["status"] == "created"
        # The newest that matches wins (steps, seed, warmup and eval cadence are not the shape).
        newer = single(c, steps=40, seed=1, eval_every=10)
        c.app.state.store.metrics.add(newer["id"], [
            {"step": s, "loss": 5.0, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}
            for s in (1, 2)])
        got = lone(c, room)
        assert got["run"] == newer["id"] and "newest single run of the same shape" in got["why"]
        never = single(c)                           # newest, and (below) never started
        assert lone(c, room)["run"] == never["id"]
        # Not a room run: no lone tab to look for.
        assert c.get(f"/api/runs/{newer['id']}/room/lone").status_code == 404
    # Past the start's grace period a run that never started has nothing to compare: skipped.
    time.sleep(0.05)
    late = settings.model_copy(update={"start_grace_s": 0.01})
    with LocalClient(create_app(late)) as c:
        assert lone(c, room)["run"] == newer["id"]
