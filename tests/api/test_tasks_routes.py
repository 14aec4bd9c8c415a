"""Toy tasks over HTTP: a task run is served its problems and alphabet instead of the corpus, the
task facts route, and a task run with corpus fields refused (the tasks themselves:
tests/unit/test_tasks.py)."""

from __future__ import annotations

import numpy as np

from andrea import tasks
from andrea.data import wire


def test_a_task_run_is_served_its_problems_and_alphabet(client):
    r = client.post("/api/runs", json={"preset": "tiny", "task": "sort", "task_digits": 6,
                                       "batch_size": 3, "steps": 20, "seed": 9})
    assert r.status_code == 201, r.text
    run = r.json()
    cfg = run["config"]
    assert (cfg["vocab_size"], cfg["task"], cfg["task_digits"], cfg["corpus_hash"]) == (
        tasks.VOCAB, "sort", 6, "")
    assert run["layout"]["config"]["vocab_size"] == tasks.VOCAB
    for url, split, step in [(run["data"]["batches"].format(step=4), "train", 4),
                             (run["data"]["val_batches"].format(index=2), "val", 2)]:
        r = client.get(url)
        assert r.status_code == 200 and r.headers["x-andrea-sources"] == "sort"
        b = wire.decode(r.content)
        assert np.array_equal(b.tokens, tasks.rows("sort", 6, 9, step, split, 3, cfg["seq_len"]))
    r = client.get(run["data"]["batches"].format(step=20))
    assert r.status_code == 400 and "beyond the run's end" in r.json()["detail"]
    tok = client.get(run["data"]["tokenizer"]).json()
    assert run["data"]["tokenizer"] == "/api/tokenizer/task"
    assert tok["vocab_size"] == tasks.VOCAB and tok["n_tokens"] == len(tasks.ALPHABET)
    import base64
    assert "".join(base64.b64decode(b).decode() for b in tok["token_bytes_b64"]) == tasks.ALPHABET
    data = client.get(f"/api/runs/{run['id']}/data").json()
    assert data["sources"] == ["sort"] and data["spec"]["task_digits"] == 6


def test_task_facts_route(client):
    f = client.get("/api/tasks/add?digits=2").json()
    assert f == {**tasks.facts("add", 2).to_dict(), "example": f["example"]}
    assert len(f["example"]) == f["problem_len"] and f["example"][f["problem_len"] - 1] == "\n"
    assert client.get("/api/tasks/nope").status_code == 404
    assert client.get("/api/tasks/mod?digits=3").status_code == 400
    assert client.get("/api/tasks/copy?digits=0").status_code == 422


def test_a_task_run_with_corpus_fields_is_refused(client):
    r = client.post("/api/runs", json={"preset": "tiny", "task": "copy", "sources": ["x"]})
    assert r.status_code == 422 and "no sources" in r.text
