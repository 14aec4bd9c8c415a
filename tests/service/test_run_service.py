"""services/runs.py on a real SQLite file, without HTTP: what update and delete do to the store
and the run's files, and what they refuse, as Refused kinds (each route's status is
web/errors.py's)."""

import pytest

from andrea.data.run_registry import RunRegistry
from andrea.errors import CONFLICT, INVALID, NOT_FOUND
from andrea.fanout import Fanout
from andrea.paths import run_dir
from andrea.services import runs as run_service
from andrea.store import Store
from tests.aio import refused, run
from tests.trainer_client import stored_config


@pytest.fixture
def parts(tmp_path):
    store = Store(tmp_path / "andrea.sqlite")
    store.runs.create("r1", stored_config(), "h")
    yield store, Fanout(), RunRegistry(store, 1.0), tmp_path
    store.close()


def test_update_names_and_tags_a_run_and_refuses_an_empty_name_or_an_unknown_run(parts):
    store, fanout, _, _ = parts
    shown = run(run_service.update(store, fanout, "r1", {
        "name": "  warm-up sweep ", "tags": [" lr ", "lr", "", "8bit"]}))
    assert (shown["name"], shown["tags"]) == ("warm-up sweep", ["lr", "8bit"])
    assert store.runs.get("r1")["name"] == "warm-up sweep"
    assert "empty" in str(refused(INVALID, run_service.update(store, fanout, "r1",
                                                                {"name": "   "})))
    assert store.runs.get("r1")["name"] == "warm-up sweep"
    refused(NOT_FOUND, run_service.update(store, fanout, "nope", {"notes": "x"}))


def test_delete_takes_the_row_and_the_files_and_refuses_while_a_trainer_is_connected(parts):
    store, fanout, runs, data_dir = parts
    files = run_dir(data_dir, "r1")
    files.mkdir(parents=True)
    (files / "weights.bin").write_bytes(b"\0" * 16)

    async def with_trainer():
        assert await fanout.claim_trainer("r1")
        try:
            await run_service.delete(store, fanout, runs, data_dir, "r1")
        finally:
            await fanout.release_trainer("r1")

    assert "stop it there first" in str(refused(CONFLICT, with_trainer()))
    assert store.runs.get("r1") is not None and files.exists()
    run(run_service.delete(store, fanout, runs, data_dir, "r1"))
    assert store.runs.get("r1") is None and not files.exists()
    refused(NOT_FOUND, run_service.delete(store, fanout, runs, data_dir, "r1"))
