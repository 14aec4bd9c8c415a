"""services/exports.py on a real SQLite data dir, without HTTP: a run's records as JSON and CSV
pages, its weights and its checkpoint's zip, and what it refuses, as Refused kinds (each
route's status is web/errors.py's)."""

import csv
import io
import json
import zipfile

import numpy as np
import pytest

from andrea.checkpoints import CheckpointStore
from andrea.errors import BROKEN, NOT_FOUND
from andrea.paths import weights_path
from andrea.run_config import run_layout
from andrea.services import exports
from andrea.store import Store
from tests.aio import refused, run
from tests.trainer_client import stored_config


@pytest.fixture
def parts(tmp_path):
    store = Store(tmp_path / "andrea.sqlite")
    store.runs.create("r1", stored_config(), "h")
    yield store, store.runs.get("r1"), tmp_path
    store.close()


async def text(pages) -> str:
    return "".join([p async for p in pages])


def rec(step: int, norms: list[float] | None = None) -> dict:
    r = {"step": step, "loss": 5.0 - step, "grad_norm": 1.0, "clip_scale": 1.0, "lr": 1e-3}
    return r if norms is None else {**r, "tensor_grad_norms": norms}


def test_records_as_json_and_csv_pages_with_a_column_per_tensor(parts, monkeypatch):
    store, row, _ = parts
    layout = run_layout(row["config"])
    names = [p["name"] for p in layout["params"]]
    norms = [0.5 + i for i in range(len(names))]
    store.metrics.add("r1", [rec(1, norms), rec(2), rec(3)])
    monkeypatch.setattr(exports, "METRICS_PAGE", 2)     # two pages

    got = json.loads(run(text(exports.json_pages(store, "r1"))))
    assert [r["step"] for r in got] == [1, 2, 3] and got[0]["tensor_grad_norms"] == norms
    assert run(text(exports.json_pages(store, "nope"))) == "[]"

    lists = exports.csv_list_columns(layout)
    assert lists["tensor_grad_norms"] == [exports.TENSOR_NORM_COLUMN + n for n in names]
    assert len(lists["mlp_dead"]) == layout["config"]["n_layer"]
    rows = list(csv.DictReader(io.StringIO(run(text(exports.csv_pages(store, row))))))
    assert list(rows[0]) == exports.csv_columns(lists)
    assert [r["step"] for r in rows] == ["1", "2", "3"] and rows[1]["loss"] == "3.0"
    assert [rows[0]["grad_norm:" + n] for n in names] == [str(x) for x in norms]
    assert rows[1]["grad_norm:" + names[0]] == ""       # a step that did not send them


def test_weights_and_a_checkpoint_refused_where_there_are_none_or_they_are_damaged(parts):
    store, row, data_dir = parts
    refused(NOT_FOUND, exports.weights(row, data_dir))              # nothing uploaded
    e = refused(NOT_FOUND, exports.weights(row, data_dir, 5))
    assert "no checkpoint at step 5" in str(e)
    refused(NOT_FOUND, exports.checkpoint_files(row, store, data_dir, data_dir, 5))
    path = weights_path(data_dir, "r1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0" * 8)                                     # not the layout's size
    assert "floats" in str(refused(BROKEN, exports.weights(row, data_dir)))


def test_a_checkpoints_weights_and_zip(parts):
    store, row, data_dir = parts
    layout = run_layout(row["config"])
    numel = layout["total_numel"]
    w = np.arange(numel, dtype=np.float32).tobytes()
    CheckpointStore(data_dir).write("r1", 2, [w, bytes(4 * numel)], "adamw", [
        {"name": "W", "bytes": 4 * numel}, {"name": "m", "bytes": 4 * numel}])
    store.metrics.add("r1", [rec(1), rec(2)])

    async def weights() -> bytes:
        size, pieces = await exports.weights(row, data_dir, 2)
        data = b"".join(pieces)
        assert len(data) == size
        return data

    safetensors = run(weights())
    released = []

    async def zipped() -> bytes:
        files = await exports.checkpoint_files(row, store, data_dir, data_dir, 2)
        return b"".join([p async for p in exports.zip_pieces(files, lambda: released.append(1))])

    with zipfile.ZipFile(io.BytesIO(run(zipped()))) as zf:
        # no tokenizer built for this run: the weights, configs and card only
        assert zf.namelist() == ["README.md", "config.json", "generation_config.json",
                                 "model.safetensors"]
        assert zf.read("model.safetensors") == safetensors
    assert released       # the client's slot is given back once the zip is read
