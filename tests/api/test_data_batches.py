"""Batches: determinism (also across processes), the wire format, splits, and bad requests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from andrea.data import wire
from andrea.data.sources import default_sources
from andrea.data.spec import BatchSpec
from andrea.data.tokenizer import EOT, decode
from andrea.data.tokens import VAL_FRACTION, TokenFile, split_point
from andrea.data.windows import data_budget, sample_batch, train_windows, val_windows
from tests.data_fixtures import TINY_V

AD_HOC = "/api/batches/{}?preset=tiny&seed=7&batch_size=4"


def _spec(**kw) -> BatchSpec:
    return BatchSpec(**{"seed": 7, "batch_size": 4, "seq_len": 64, "vocab_size": TINY_V,
                        "total_steps": 1000, **kw})


def test_same_seed_and_step_same_bytes(data_client):
    a = data_client.get(AD_HOC.format(3))
    assert a.status_code == 200 and a.headers["content-type"] == wire.MEDIA_TYPE
    assert data_client.get(AD_HOC.format(3)).content == a.content
    assert data_client.get(AD_HOC.format(4)).content != a.content
    other_seed = data_client.get("/api/batches/3?preset=tiny&seed=8&batch_size=4")
    assert other_seed.content != a.content


def test_header_and_rows_match_the_token_files(data_client, tiny):
    r = data_client.get("/api/batches/5?preset=tiny&seed=1&batch_size=6")
    body = r.content
    head = np.frombuffer(body, "<u4", 10)
    K = len(tiny.files)
    assert body[:4] == b"ANDB" and list(head[1:9]) == [1, 6, 64, 5, 0, 4, K, 0xFFFFFFFF]
    assert head[9] == 48 and len(body) == 48 + 6 * 65 * 4
    b = wire.decode(body)
    assert b.tokens.shape == (6, 65) and b.tokens.dtype == np.dtype("<u4")
    assert r.headers["x-andrea-sources"] == ",".join(tiny.source_names)
    # Each row is a window of the source its header byte names, inside the train part.
    for row, src in zip(b.tokens, b.sources):
        f = tiny.files[src]
        train = np.asarray(f.tokens[:f.n_train])
        hits = np.flatnonzero(train[:f.n_train - 64] == row[0])
        assert any(np.array_equal(train[h:h + 65], row) for h in hits)


def test_sampler_is_the_endpoints(data_client, tiny):
    spec = _spec(seed=7, total_steps=100_000)
    tokens, sources = sample_batch(tiny.files, spec, 3)
    b = wire.decode(data_client.get(AD_HOC.format(3)).content)
    assert np.array_equal(b.tokens, tokens) and np.array_equal(b.sources, sources)


CHILD = """
import sys
from pathlib import Path
from fastapi.testclient import TestClient
from andrea.app import create_app
from andrea.config import Settings
with TestClient(create_app(Settings(data_dir=Path(sys.argv[1])))) as c:
    for url in sys.argv[2:]:
        r = c.get(url)
        assert r.status_code == 200, r.text
        sys.stdout.buffer.write(r.content)
"""


def test_same_bytes_in_two_server_processes(data_dir, data_client):
    urls = [AD_HOC.format(11), "/api/val_batches/2?preset=tiny&batch_size=4",
            "/api/batches/40?preset=tiny&seed=3&batch_size=2&mode=bandit"]
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(data_dir), *urls],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        outs.append(out)
    here = b"".join(data_client.get(u).content for u in urls)
    assert outs[0] == outs[1] == here


def test_validation_never_overlaps_training(tiny):
    spec = _spec(batch_size=16)
    for step in range(200):
        src, start = train_windows(tiny.files, spec, step, np.ones(len(tiny.files)))
        n_train = np.array([tiny.files[i].n_train for i in src])
        assert np.all(start >= 0) and np.all(start + 65 <= n_train)
    for index in range(200):
        src, start = val_windows(tiny.files, spec, index)
        n_train = np.array([tiny.files[i].n_train for i in src])
        n = np.array([tiny.files[i].n_tokens for i in src])
        assert np.all(start >= n_train) and np.all(start + 65 <= n)
        assert set(src.tolist()) == set(range(len(tiny.files)))   # every eval batch: every source


def test_validation_is_whole_documents(tiny):
    """The split falls on a document boundary: the held-out part is the last documents of the
    source's stream, whole, and no training window can hold a token of any of them."""
    meta = json.loads((Path(tiny.files[0].tokens.filename).parent / "meta.json").read_text())
    for f, source, entry in zip(tiny.files, tiny.sources, meta["sources"]):
        ids = np.asarray(f.tokens)
        assert entry["split"] == "documents" and ids[f.n_train - 1] == 0   # after an end-of-text
        k = entry["n_val_documents"]
        assert k >= 1 and int(np.count_nonzero(ids[f.n_train:] == 0)) == k
        assert decode(tiny.tokenizer, ids[f.n_train:]) == "".join(
            d + EOT for d in source.documents[-k:])
        assert abs(f.n_val / f.n_tokens - VAL_FRACTION) < 0.03, f.name


def test_data_budget():
    b = data_budget([1000, 100_000, 50], batch_size=4, seq_len=64, steps=100)
    assert b["tokens_per_step"] == 256 and b["total_tokens"] == 25_600
    assert b["passes"] == [12.8, 0.128, 0.0]          # the 50-token source is too short for a row
    assert b["warn"] and abs(b["passes_overall"] - 25_600 / 101_050) < 1e-12
    assert not data_budget([10**6, 10**6], 8, 1024, 100)["warn"]


def test_split_point_rules():
    assert split_point([100]) == (90, "tokens")                  # one document: cut in it
    assert split_point([10, 89, 91, 100]) == (91, "documents")   # nearest to 90: a tie, the later
    assert split_point([10, 80, 95, 100]) == (95, "documents")   # 5%: half of VAL_FRACTION
    assert split_point([80, 100]) == (80, "documents")           # 20%: twice it
    # The nearest boundary would hold out half, or 1%, of the tokens (a long document at one
    # end): the source is cut in that document instead.
    assert split_point([50, 100]) == (90, "tokens")
    assert split_point([99, 100]) == (90, "tokens")
    assert split_point([7, 56009]) == (50409, "tokens")          # a README, then a book
    ends = list(range(7, 7001, 7))
    n_train, how = split_point(ends)
    assert how == "documents" and n_train in ends[:-1] and abs(n_train - 6300) <= 3


def test_validation_batches(data_client):
    url = "/api/val_batches/{}?preset=tiny&batch_size=4&seed={}"
    a = data_client.get(url.format(0, 1)).content
    assert wire.decode(a).split == "val"
    assert data_client.get(url.format(0, 2)).content == a   # the same eval text for every seed
    assert data_client.get(url.format(1, 1)).content != a


def test_fixed_weights_and_uniform_mix(tiny):
    K = len(tiny.files)
    only_docs = (1.0,) + (0.0,) * (K - 1)
    _, rows = sample_batch(tiny.files, _spec(mode="fixed", weights=only_docs), 0)
    assert set(rows.tolist()) == {0}
    counts = np.zeros(K)
    for step in range(100):
        counts += np.bincount(sample_batch(tiny.files, _spec(batch_size=8), step)[1], minlength=K)
    assert np.all(np.abs(counts / counts.sum() - 1 / K) < 0.1)


def test_run_registry_endpoint(data_client, tiny):
    runs = data_client.app.state.runs
    runs.register("r1", _spec(total_steps=10, corpus_hash=tiny.corpus_hash))
    r = data_client.get("/api/runs/r1/batches/9")
    assert r.status_code == 200 and r.headers["x-andrea-run"] == "r1"
    assert np.array_equal(wire.decode(r.content).tokens, sample_batch(tiny.files, _spec(), 9)[0])
    assert data_client.get("/api/runs/r1/val_batches/0").status_code == 200
    data = data_client.get("/api/runs/r1/data").json()
    assert data["sources"] == tiny.source_names and data["phases"] == []
    runs.register("old", _spec(corpus_hash="0123456789abcdef"))
    r = data_client.get("/api/runs/old/batches/0")
    assert r.status_code == 409 and "corpus" in r.json()["detail"]


def test_corpus_description(data_client, tiny):
    body = data_client.get("/api/corpus").json()
    assert body["corpus_hash"] == tiny.corpus_hash and body["vocab_size"] == TINY_V
    for s in body["sources"]:
        assert s["tokens"] == s["train_tokens"] + s["val_tokens"] and s["val_tokens"] > 0
        assert s["chars"] > s["tokens"] > 0


@pytest.mark.parametrize("url, status, words", [
    ("/api/batches/-1?preset=tiny", 422, "greater than or equal to 0"),
    ("/api/batches/abc?preset=tiny", 422, "valid integer"),
    ("/api/batches/1.5?preset=tiny", 422, "valid integer"),
    ("/api/batches/0?preset=tiny&seed=x", 422, "valid integer"),
    ("/api/batches/0?preset=tiny&batch_size=0", 422, "greater than or equal to 1"),
    ("/api/batches/0?preset=tiny&mode=greedy", 422, "uniform"),
    ("/api/batches/0?preset=tiny&colour=red", 422, "Extra inputs"),
    ("/api/batches/10?preset=tiny&steps=10", 400, "beyond the run's end"),
    ("/api/batches/0?preset=nope", 400, "unknown preset"),
    ("/api/batches/0?preset=tiny&mode=fixed", 400, "needs weights"),
    ("/api/batches/0?preset=tiny&mode=fixed&weights=1", 400,
     f"1 weights given for {len(default_sources())} sources"),
    ("/api/batches/0?preset=tiny&mode=fixed&weights=1,-1", 400, "non-negative"),
    ("/api/batches/0?preset=tiny&mode=fixed&weights=a,b", 400, "comma-separated numbers"),
    ("/api/batches/0?preset=tiny&weights=1,1", 400, "only used with mode 'fixed'"),
    ("/api/batches/0?preset=tiny&batch_size=4096&seq_len=65536", 400, "batch_size * (seq_len + 1)"),
    ("/api/runs/nope/batches/0", 404, "unknown run 'nope'"),
    ("/api/runs/nope/val_batches/0", 404, "unknown run 'nope'"),
    ("/api/runs/nope/data", 404, "unknown run 'nope'"),
    ("/api/runs/nope/batches/-3", 422, "greater than or equal to 0"),
    ("/api/corpus?preset=huge", 404, "unknown tokenizer"),
])
def test_bad_requests_are_clear_4xx(data_client, url, status, words):
    r = data_client.get(url)
    assert r.status_code == status, r.text
    assert words in r.text


def test_sources_too_short_for_a_row_are_skipped_or_refused():
    short = TokenFile("short", np.arange(50, dtype=np.uint16), 45)
    long = TokenFile("long", np.arange(1000, dtype=np.uint16), 900)
    _, sources = sample_batch([short, long], _spec(seq_len=64, batch_size=32), 0)
    assert set(sources.tolist()) == {1}
    with pytest.raises(ValueError, match="training tokens a row needs"):
        sample_batch([short], _spec(seq_len=64), 0)
    with pytest.raises(ValueError, match="validation tokens a row needs"):
        sample_batch([short, long], _spec(seq_len=200), 0, "val")


def test_step_beyond_a_runs_end(data_client, tiny):
    data_client.app.state.runs.register("short", _spec(total_steps=5))
    assert data_client.get("/api/runs/short/batches/4").status_code == 200
    r = data_client.get("/api/runs/short/batches/5")
    assert r.status_code == 400 and "0 to 4" in r.json()["detail"]


# ---- a run's sources: rows from the picked sources only ---------------------------------------

def _run(client, **config) -> dict:
    r = client.post("/api/runs", json={"preset": "tiny", "batch_size": 8, "steps": 200,
                                       **config})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_run_on_one_source_draws_every_row_from_it(data_client, tiny):
    names = tiny.source_names
    run = _run(data_client, sources=["python-tests"])
    assert run["config"]["sources"] == ["python-tests"]
    assert run["data"]["spec"]["sources"] == ["python-tests"]
    assert data_client.get(f"/api/runs/{run['id']}").json()["config"]["sources"] == \
        ["python-tests"]
    want = names.index("python-tests")
    batches = {}
    for split, url in (("train", "batches"), ("val", "val_batches")):
        for step in range(40):
            r = data_client.get(f"/api/runs/{run['id']}/{url}/{step}")
            assert r.status_code == 200, r.text
            assert r.headers["x-andrea-sources"] == ",".join(names)   # indices: the corpus's
            b = wire.decode(r.content)
            assert b.n_sources == len(names)
            assert b.sources.tolist() == [want] * 8, (split, step)  # every row: python-tests
            f = tiny.files[want]
            lo, hi = (0, f.n_train) if split == "train" else (f.n_train, f.n_tokens)
            ids = np.asarray(f.tokens[lo:hi])
            windows = np.lib.stride_tricks.sliding_window_view(ids, 65)
            for row in b.tokens:                                      # and its text
                hits = np.flatnonzero(windows[:, 0] == row[0])
                assert (windows[hits] == row).all(axis=1).any()
            batches[split, step] = r.content
    # The same bytes for the same (run, step) after the server forgets the run (a restart, a
    # resume): the spec, sources included, comes back from the stored config.
    data_client.app.state.runs.forget(run["id"])
    assert data_client.get(f"/api/runs/{run['id']}/batches/7").content == batches["train", 7]
    assert data_client.get(f"/api/runs/{run['id']}/val_batches/3").content == batches["val", 3]


def test_picking_every_source_is_picking_none(tiny):
    """A spec that picks every source draws exactly the batches of one that picks none (runs
    made before sources could be picked resume on the same bytes); a subset other bytes."""
    every = _spec(sources=tuple(reversed(tiny.source_names)))
    two = _spec(sources=tuple(tiny.source_names[:2]))
    for step in range(20):
        for split in ("train", "val"):
            a = sample_batch(tiny.files, _spec(), step, split)
            b = sample_batch(tiny.files, every, step, split)
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
            assert set(sample_batch(tiny.files, two, step, split)[1].tolist()) <= {0, 1}
    counts = np.bincount(np.concatenate([sample_batch(tiny.files, two, s)[1]
                                         for s in range(100)]), minlength=2)
    assert counts.size == 2 and abs(counts[0] / counts.sum() - 0.5) < 0.1   # uniform over two
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        sample_batch(tiny.files, _spec(sources=("nope",)), 0)


def test_a_bandit_over_picked_sources(data_client, tiny):
    """The source bandit of a run on two sources mixes those two alone: the others have weight
    0 in every phase and never give a row, and the weights follow the one whose loss falls."""
    from andrea.data.bandit import PhaseSchedule

    names = tiny.source_names
    picked = [names[0], names[2]]
    run = _run(data_client, data_mode="bandit", sources=list(reversed(picked)), seed=4)
    assert run["config"]["sources"] == picked                 # in corpus order
    auth = {"authorization": f"Bearer {run['token']}"}
    for step in range(1, 160):       # as the trainer's telemetry would: source index -> loss
        r = data_client.post(f"/api/runs/{run['id']}/source_losses", headers=auth, json={
            "step": step, "losses": {"0": 3.0, "2": 5.0 * 0.99 ** step}})
        assert r.status_code == 200, r.text
    phases = PhaseSchedule(4).phases_until(160)
    for _, start, _ in phases:
        b = wire.decode(data_client.get(f"/api/runs/{run['id']}/batches/{start}").content)
        assert set(b.sources.tolist()) <= {0, 2}
    marks = data_client.get(f"/api/runs/{run['id']}/data").json()["phases"]
    assert len(marks) == len(phases)
    for m in marks:
        w = m["weights"]
        assert w[1] == 0 and all(x == 0 for x in w[3:]) and abs(sum(w) - 1) < 1e-12
        assert min(w[0], w[2]) >= 0.2 / 2 - 1e-12           # EXPLORE / K, K = the two picked
    assert marks[0]["weights"][0] == marks[0]["weights"][2] == 0.5
    assert marks[-1]["weights"][2] > marks[-1]["weights"][0]   # its loss still falls


@pytest.mark.parametrize("sources, words", [
    (["python-docs", "nope"], "unknown source 'nope'; this server's sources are python-docs"),
    (["a", "b"], "unknown sources 'a', 'b'"),
    ([], "at least 1 item"),
    (["python-docs", "python-docs"], "'python-docs' listed more than once"),
    ("python-docs", "valid list"),
])
def test_unknown_or_bad_sources_are_refused(data_client, sources, words):
    r = data_client.post("/api/runs", json={"preset": "tiny", "sources": sources})
    assert r.status_code == 422 and words in r.text, r.text


GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _golden_batch() -> wire.Batch:
    """The batch tests/golden/batch_wire.json describes."""
    spec = json.loads((GOLDEN / "batch_wire.json").read_text())
    tokens = np.array(spec["tokens"], np.uint32)
    assert tokens.shape == (spec["B"], spec["T"] + 1)
    return wire.Batch(spec["step"], spec["split"], spec["n_sources"], spec["phase"],
                      np.array(spec["sources"], np.uint8), tokens)


def test_wire_format_matches_the_golden_file():
    """wire.py writes exactly the golden bytes, which tests/js/batches.test.mjs parses with the
    engine's batches.js: a change to either side of the format fails one of the two."""
    golden = (GOLDEN / "batch_wire.bin").read_bytes()
    assert wire.encode(_golden_batch()) == golden
    back = wire.decode(golden)
    assert back.phase == 2 and back.split == "val" and back.tokens[1, 4] == 0xFFFFFFFF


if __name__ == "__main__" and sys.argv[1:] == ["--write-golden"]:
    (GOLDEN / "batch_wire.bin").write_bytes(wire.encode(_golden_batch()))
