"""The spikes route on records sent through the trainer socket: each outlier row's source and text,
and the sources whose weight changed at a phase boundary (spike detection itself:
tests/unit/test_spikes.py)."""

import pytest

from andrea.config import Settings
from andrea.spikes import FACTOR
from tests.unit.test_spikes import run


@pytest.fixture
def settings(tmp_path) -> Settings:
    """Each spike list current: these tests read a run's spikes right after its trainer's
    records (the window a trained run's list may lag, spikes_fresh_s, is tested in
    test_web_reads.py)."""
    return Settings(data_dir=tmp_path / "data", spikes_fresh_s=0)


def test_the_spikes_route_names_each_outlier_rows_source_and_text(client):
    """Records with a planted spike go through the trainer socket; GET .../spikes finds it and
    gives its outlier row's source and text: the row of the run's own batch for that step,
    decoded with the run's tokenizer."""
    from andrea.data import tokenizer as tk
    from andrea.data import wire

    made = client.post("/api/runs", json={"preset": "tiny", "batch_size": 4, "steps": 100}).json()
    records = [{**r, "row_losses": [round(r["loss"], 3)] * 4} for r in run(n=100)]
    records[59]["grad_norm"] = 9.0                         # step 60: row 1 far above the rest
    records[59]["row_losses"] = [4.0, 11.0, 4.2, 3.9]
    with client.websocket_connect(f"/ws/runs/{made['id']}") as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": records[:80]})
        assert ws.receive_json() == {"type": "ack", "step": 80}
        got = client.get(f"/api/runs/{made['id']}/spikes").json()
        assert client.get(f"/api/runs/{made['id']}/spikes").json() == got   # (kept)
        records[89]["grad_norm"] = 8.0                     # a later spike: a new answer
        ws.send_json({"type": "metrics", "records": records[80:]})
        assert ws.receive_json() == {"type": "ack", "step": 100}
        later = client.get(f"/api/runs/{made['id']}/spikes").json()["spikes"]
        assert [s["step"] for s in later] == [60, 90]
    assert got["rule"]["factor"] == FACTOR
    (s,) = got["spikes"]
    assert s["step"] == 60 and s["rows"][0]["row"] == 1 and s["rows"][0]["loss"] == 11.0
    # What the trainer got for step 60 (0-based 59), decoded as the run's tokenizer does.
    batch = wire.decode(client.get(f"/api/runs/{made['id']}/batches/59").content)
    corpus = client.app.state.data.prepared(made["config"]["vocab_size"])
    assert s["rows"][0]["source"] == corpus.source_names[int(batch.sources[1])]
    want = tk.decode(corpus.tokenizer, batch.tokens[1][:-1])[:300]
    assert s["rows"][0]["text"] == want and len(want) > 20
    assert client.get("/api/runs/nope/spikes").status_code == 404


def test_a_boundary_spike_names_the_sources_whose_weight_changed(client):
    """A bandit run: records carry their phase and per-source losses through the trainer socket
    (the bandit learns from them); a spike planted where a phase starts says which sources'
    sampling weights changed there, from the phases the server decided."""
    from andrea.data.bandit import PhaseSchedule

    made = client.post("/api/runs", json={"preset": "tiny", "batch_size": 4, "steps": 200,
                                          "data_mode": "bandit", "seed": 3}).json()
    phases = PhaseSchedule(3).phases_until(200)            # (index, start, length), 0-based
    phase_of = {s: k for k, start, length in phases for s in range(start, start + length)}
    k, start, _ = next(p for p in phases if p[1] >= 40)    # a boundary past MIN_HISTORY
    records = run(n=start + 1)
    for r in records:
        r["phase"] = phase_of[r["step"] - 1]
        r["source_losses"] = {"0": 3.0, "1": 5.0 * 0.98 ** r["step"]}
    records[-1]["grad_norm"] = 9.0                         # step start + 1: phase k's first
    with client.websocket_connect(f"/ws/runs/{made['id']}") as ws:
        ws.send_json({"type": "hello", "token": made["token"]})
        assert ws.receive_json()["type"] == "welcome"
        ws.send_json({"type": "metrics", "records": records})
        assert ws.receive_json() == {"type": "ack", "step": start + 1}
    assert client.get(f"/api/runs/{made['id']}/batches/{start}").status_code == 200
    decided = {p["index"]: p["weights"] for p in client.get(
        f"/api/runs/{made['id']}/data").json()["phases"]}
    (s,) = client.get(f"/api/runs/{made['id']}/spikes").json()["spikes"]
    b = s["boundary"]
    assert (b["phase"], b["previous"], b["steps_after"]) == (k, k - 1, 0)
    names = client.get("/api/corpus?preset=tiny").json()["sources"]
    want = [{"source": names[i]["name"], "before": w0, "after": w1}
            for i, (w0, w1) in enumerate(zip(decided[k - 1], decided[k])) if abs(w1 - w0) > 1e-9]
    assert want and sorted(b["weights"], key=lambda c: c["source"]) == \
        sorted(want, key=lambda c: c["source"])
    assert abs(b["weights"][0]["after"] - b["weights"][0]["before"]) == max(
        abs(c["after"] - c["before"]) for c in want)
    # A restart (or a resume) rebuilds the bandit from the records, and no batch is asked for
    # since (a finished run): the same phases, the same boundary.
    client.app.state.runs.forget(made["id"])
    assert client.get(f"/api/runs/{made['id']}/spikes").json()["spikes"] == [s]
