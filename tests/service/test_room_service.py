"""services/rooms.py on a real SQLite data dir, without HTTP: a room run made by
services/runs.py, workers joined, pseudo-gradients taken from files as the route receives them,
the round closed; what the room refuses, as Refused kinds (each route's status is
web/errors.py's)."""

import numpy as np
import pytest

from andrea.checkpoints import CheckpointStore
from andrea.config import Settings
from andrea.data.run_registry import RunRegistry
from andrea.errors import CONFLICT, INVALID, NOT_ALLOWED, NOT_FOUND, Refused
from andrea.fanout import Fanout
from andrea.room import codec
from andrea.room.rounds import param_mask
from andrea.run_config import RunConfig
from andrea.services import rooms
from andrea.services import runs as run_service
from andrea.storage import StorageBudget
from andrea.store import Store
from tests.aio import refused, run
from tests.trainer_client import stored_config


class NoCorpus:
    """The data a room run's creation asks about (its corpus is not read here)."""
    def corpus_hash(self) -> str:
        return ""

    def sources(self) -> list:
        return []

    def ready(self, vocab_size: int):
        return None


@pytest.fixture
def parts(tmp_path):
    store = Store(tmp_path / "andrea.sqlite")
    settings = Settings(data_dir=tmp_path)
    yield (store, Fanout(), CheckpointStore(tmp_path, settings.checkpoints_kept),
           StorageBudget(tmp_path, 0), settings)
    store.close()


def room_run(parts) -> dict:
    store, fanout, ckpts, storage, settings = parts
    config = RunConfig(preset="tiny", steps=6, batch_size=2, seed=5,
                       room={"inner_steps": 3, "codec": "f32", "max_workers": 4})
    made = run(run_service.create(config, store, NoCorpus(), RunRegistry(store, 1.0), fanout,
                                  ckpts, settings, storage))
    return {"row": store.runs.get(made.run_id), "join_token": made.join_token,
            "layout": made.layout}


def body(room, name: str, delta: np.ndarray):
    """A pseudo-gradient received whole into a file of the room's folder, as the route leaves
    it."""
    path = room.dir / f"{name}.upload"
    path.write_bytes(codec.encode(delta, room.room.codec))
    return path


def test_two_workers_close_a_round_and_a_second_or_stale_delta_is_refused(parts):
    store, fanout, ckpts, storage, _ = parts
    made = room_run(parts)
    room = rooms.room_of(made["row"], ckpts)
    a = run(rooms.join(room, fanout, made["join_token"], "10.0.0.1"))
    b = run(rooms.join(room, fanout, made["join_token"], "10.0.0.2"))
    assert (a["worker"], b["worker"], a["version"], a["rounds"]) == (0, 1, 0, 2)
    rng = np.random.default_rng(0)
    mask = param_mask(made["layout"])
    deltas = [(rng.standard_normal(room.numel) * 2e-4).astype(np.float32) * mask
              for _ in range(2)]

    first = body(room, "a", deltas[0])
    assert run(rooms.accept_delta(room, store, fanout, storage, a["token"], 0, first)) == {
        "closed": False, "version": 0}
    assert not first.exists()                           # taken into the round
    again = body(room, "a2", deltas[0])
    assert "already sent" in str(refused(CONFLICT, rooms.accept_delta(
        room, store, fanout, storage, a["token"], 0, again)))
    assert not again.exists()                           # refused: removed all the same
    assert run(rooms.state(room))["open"]["waiting_for"] == [1]

    assert run(rooms.accept_delta(room, store, fanout, storage, b["token"], 0,
                                  body(room, "b", deltas[1]))) == {"closed": True, "version": 0}
    now = run(rooms.state(room))
    assert now["version"] == 1 and not now["finished"] and len(now["closed"]) == 1
    assert now["open"]["received"] == [] and now["open"]["waiting_for"] == [0, 1]
    assert all("token_sha256" not in w and "address" not in w for w in now["workers"])
    size, f = run(rooms.weights(room, 1))
    f.close()
    assert size == 4 * room.numel
    # Version 0 is no longer the one trained: a delta for it is stale.
    assert "dropped" in str(refused(CONFLICT, rooms.accept_delta(
        room, store, fanout, storage, a["token"], 0, body(room, "old", deltas[0]))))


def test_what_the_room_refuses_and_what_it_keeps(parts):
    store, fanout, ckpts, storage, settings = parts
    made = room_run(parts)
    room = rooms.room_of(made["row"], ckpts)
    refused(NOT_ALLOWED, rooms.join(room, fanout, "not the join token", "10.0.0.1"))
    a = run(rooms.join(room, fanout, made["join_token"], "10.0.0.1"))
    refused(NOT_ALLOWED, rooms.check_sender(room, "not a worker"))
    run(rooms.check_sender(room, a["token"]))

    run(rooms.progress(room, fanout, a["token"], 0, 2))
    assert run(rooms.state(room))["workers"][0]["state"] == "training"
    refused(INVALID, rooms.progress(room, fanout, a["token"], 0, 4))     # H is 3
    nan = np.zeros(room.numel, np.float32)
    nan[7] = np.nan
    e = refused(INVALID, rooms.accept_delta(room, store, fanout, storage, a["token"], 0,
                                            body(room, "nan", nan)))
    assert "not finite" in str(e) and "a good one may still be sent" in str(e)
    assert run(rooms.state(room))["workers"][0]["state"] == "refused"
    run(rooms.report(room, fanout, a["token"], 0, [5.0, 4.5], 5.5, None, settings.max_run_bytes))
    refused(CONFLICT, rooms.report(room, fanout, a["token"], 0, [5.0], None, None,
                                   settings.max_run_bytes))
    page = run(rooms.reports(room, 0, 10))
    assert page["total"] == 1 and page["next"] is None
    assert page["reports"][0]["losses"] == [5.0, 4.5]

    run(rooms.remove(room, store, fanout, storage, a["worker"]))
    assert "removed" in str(refused(NOT_ALLOWED, rooms.join(room, fanout, made["join_token"],
                                                            "10.0.0.1")))
    refused(NOT_FOUND, rooms.remove(room, store, fanout, storage, 9))

    store.runs.create("plain", stored_config(), "h")
    refused(NOT_FOUND, rooms.lone(store.runs.get("plain"), ckpts, store, settings))
    with pytest.raises(Refused) as e:
        rooms.room_of(store.runs.get("plain"), ckpts)
    assert e.value.kind == NOT_FOUND
    lone = run(rooms.lone(made["row"], ckpts, store, settings))
    assert lone["run"] is None and "room" not in lone["config"]
