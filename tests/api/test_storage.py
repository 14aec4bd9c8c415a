"""Storage budgets that hold for every writer, and write rates bounded in bytes (server/storage.py,
quotas.MessageRates), against real servers with small limits (ANDREA_* settings). A small disk
is the server's view of its data dir's disk made small (tests/fake_disk: a disk as big as the
data dir's files plus ANDREA_MIN_FREE_BYTES plus a few MiB), so that what the rest of the
machine writes meanwhile cannot move it:

  - trainers streaming big records are closed (protocol.STORAGE_BUDGET) with a clear message
    before the floor, nothing they had acked is lost, a victim is told the same (no
    SQLITE_FULL), the operator deletes a run at the floor and the victim writes again;
  - two checkpoint uploads that each fit but together cross the floor: one 201, one 507;
  - a run whose records would pass ANDREA_MAX_RUN_BYTES is refused at creation, and one past it
    at run time is closed;
  - trainer messages paced by their bytes per run and per client address (the order of acks),
    and the buckets' and the budget's arithmetic with their clocks injected;
  - the estimate of a record's stored bytes held to a real SQLite store."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.metrics import Record
from andrea.storage import (
    FLOOR,
    FULL_RETRY_S,
    RUN_BYTES,
    DiskFull,
    StorageBudget,
    StorageFull,
    estimated_run_bytes,
    message_bytes,
)
from andrea.store import Store
from andrea.telemetry.protocol import MAX_MESSAGE_BYTES, STORAGE_BUDGET
from andrea.web.quotas import MessageRates
from tests import aio
from tests.fake_disk.sitecustomize import _used as files_bytes
from tests.servers import Server, serve
from tests.trainer_client import bearer, hello, new_run, record, stored_config, stored_steps, ws_url

ADMIN = "storage-test-operator"
MIB = 1 << 20
FAST = {"metrics_bytes_per_s": 1 << 30, "client_metrics_bytes_per_s": 1 << 30}


# ---- helpers ---------------------------------------------------------------------------------


FAKE_DISK = Path(__file__).resolve().parents[1] / "fake_disk"
FLOOR_BYTES = 64 * MIB


@pytest.fixture
def server(servers):
    """start(data_dir, above_floor=None, **settings) -> Server: a server of the test's own
    (`servers`); given `above_floor`, on a small disk: the data dir's files now, its floor
    (ANDREA_MIN_FREE_BYTES, FLOOR_BYTES) and `above_floor` bytes more."""
    def start(data_dir: Path, above_floor: int | None = None, **settings) -> Server:
        if above_floor is None:
            return servers(data_dir, **settings)
        data_dir.mkdir(parents=True, exist_ok=True)
        path = os.environ.get("PYTHONPATH")
        return servers(data_dir, min_free_bytes=FLOOR_BYTES, **settings, env={
            "FAKE_DISK_DIR": str(data_dir),
            "FAKE_DISK_BYTES": str(files_bytes(data_dir) + FLOOR_BYTES + above_floor),
            "PYTHONPATH": os.pathsep.join([str(FAKE_DISK), *([path] if path else [])])})
    return start


def big_record(step: int, batch: int) -> dict:
    """A record with per-row losses of a batch of `batch` rows (~9 bytes each on the wire)."""
    return {**record(step), "row_losses": [round(3 + (i % 97) / 97, 6) for i in range(batch)]}


def metrics(first: int, n: int, batch: int) -> str:
    """A metrics message of n big records, compact as the page sends it (~9.3 KB a record)."""
    return json.dumps({"type": "metrics", "records": [big_record(s, batch) for s in range(
        first, first + n)]}, separators=(",", ":"))


def stream_until_closed(ws, first: int, per: int, batch: int, limit: int) -> tuple[list, object]:
    """Sends metrics messages of `per` records (each after the previous one's ack) until the
    server closes the socket: (the steps acked, the close with its last error message)."""
    acked, errors, step = [], [], first
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(limit):
            ws.send(metrics(step, per, batch))
            msg = json.loads(ws.recv(timeout=60))
            while msg["type"] == "error":
                errors.append(msg)
                msg = json.loads(ws.recv(timeout=60))
            assert msg == {"type": "ack", "step": step + per - 1}, msg
            acked += list(range(step, step + per))
            step += per
    assert errors, "no error message before the close"
    return acked, (closed.value.rcvd, errors[-1])


def assert_storage_close(close, kind: str) -> str:
    frame, error = close
    assert frame is not None and frame.code == STORAGE_BUDGET, frame
    assert frame.reason.startswith(f"{kind}: "), frame.reason
    assert error["kind"] == kind and error["message"].startswith(f"{kind}: ")
    assert "storage budget" in error["message"]
    assert "SQLITE_FULL" not in error["message"]
    return error["message"]


# ---- (1) records stop before the floor; the operator can always delete --------------------------


def test_trainers_are_closed_before_the_floor_and_the_operator_deletes_at_it(server, tmp_path):
    """Before: three runs streaming per-row losses filled a 1.2 GB disk to 0 B; every other
    trainer then got SQLITE_FULL, new runs 507 and the operator's DELETE 503."""
    data = tmp_path / "data"
    earlier = server(data)
    cfg = {"batch_size": 1024, "steps": 20_000}
    attacker, victim = new_run(earlier.url, **cfg), new_run(earlier.url, **cfg)
    earlier.stop()
    url = server(data, 24 * MIB, admin_token=ADMIN, **FAST).url

    with connect(ws_url(url, f"/ws/runs/{victim['id']}"), max_size=None) as vws:
        assert hello(vws, victim["token"])["type"] == "welcome"
        vws.send(metrics(1, 10, 1024))
        assert json.loads(vws.recv(timeout=60)) == {"type": "ack", "step": 10}
        victim_acked = list(range(1, 11))

        # The attacker: 25 records (~330 KB as stored) a message until it is closed.
        with connect(ws_url(url, f"/ws/runs/{attacker['id']}"), max_size=None) as aws:
            assert hello(aws, attacker["token"])["type"] == "welcome"
            acked, close = stream_until_closed(aws, 1, 25, 1024, limit=800)
        message = assert_storage_close(close, FLOOR)
        assert "ANDREA_MIN_FREE_BYTES" in message and "ask the operator" in message
        assert f"records up to step {acked[-1]} are stored" in message
        assert 10 <= len(acked) // 100 <= 20    # ~24 MiB of ~13 KB records (and the WAL)
        assert stored_steps(url, attacker["id"]) == acked   # every acked record, nothing more

        # The victim is told the same (before: SQLITE_FULL), its records kept.
        more, close = stream_until_closed(vws, 11, 25, 1024, limit=12)
        assert_storage_close(close, FLOOR)
        victim_acked += more
    assert stored_steps(url, victim["id"]) == victim_acked

    # A new run whose records do not fit above the floor: 507 with its figure.
    r = httpx.post(url + "/api/runs", json={"preset": "tiny", **cfg}, timeout=60)
    assert r.status_code == 507, r.text
    assert "whose records would take about" in r.json()["detail"]
    assert "20,000 steps" in r.json()["detail"] and "storage budget" in r.json()["detail"]

    # The operator deletes the attacker's run at the floor (its trainer is gone: no 409).
    for _ in range(100):
        gone = httpx.delete(f"{url}/api/runs/{attacker['id']}", timeout=60,
                            headers=bearer(ADMIN))
        if gone.status_code != 409:
            break
        time.sleep(0.1)
    assert gone.status_code == 204, gone.text

    # ...and the victim writes again: the deleted rows' pages are free for records.
    step = victim_acked[-1] + 1
    with connect(ws_url(url, f"/ws/runs/{victim['id']}"), max_size=None) as vws:
        assert hello(vws, victim["token"], victim_acked[-1])["type"] == "welcome"
        vws.send(metrics(step, 25, 1024))
        assert json.loads(vws.recv(timeout=60)) == {"type": "ack", "step": step + 24}
    assert stored_steps(url, victim["id"]) == victim_acked + list(range(step, step + 25))


# ---- (2) uploads at once cannot cross the floor together -----------------------------------------


def test_two_checkpoint_uploads_that_together_cross_the_floor_get_201_and_507(server, tmp_path):
    """Before: every concurrent upload passed the floor check at its start."""
    data = tmp_path / "data"
    earlier = server(data)
    run = new_run(earlier.url, n_embd=256, n_layer=2, n_head=4, ffn_dim=768, steps=100)
    size = sum(s["bytes"] for s in run["checkpoint"]["sections"])      # ~21 MiB
    earlier.stop()
    url = server(data, size * 3 // 2).url        # room for one, not two
    body = bytes(size)
    auth = {**bearer(run["token"]),                        # (one chunk: under 64 MiB)
            "x-andrea-chunk-sha256": hashlib.sha256(body).hexdigest()}
    folder = data / "runs" / run["id"] / "checkpoints"
    release, answers = threading.Event(), {}

    def slow_body():
        yield body[:5 * MIB]         # past the server's first flush (4 MiB): on disk
        release.wait(120)
        for i in range(5 * MIB, size, MIB):
            yield body[i:i + MIB]

    def first():
        answers[1] = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/1", content=slow_body(),
                               headers=auth, timeout=120)
    thread = threading.Thread(target=first)
    thread.start()
    try:
        for _ in range(600):        # the first upload is under way: its reservation is held
            parts = list(folder.glob("*.part")) if folder.exists() else []
            if parts and parts[0].stat().st_size >= 4 * MIB:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the first upload never reached the disk")
        second = httpx.put(f"{url}/api/runs/{run['id']}/checkpoints/2", content=body,
                           headers=auth, timeout=120)
    finally:
        release.set()
        thread.join(120)
    assert second.status_code == 507, second.text
    assert second.headers["retry-after"] == "30"     # a page tries again then, not every 8 s
    detail = second.json()["detail"]
    assert "not enough disk space for checkpoint 2" in detail
    assert "promised to uploads in progress" in detail and "storage budget" in detail
    assert answers[1].status_code == 201, answers[1].text
    assert [c["step"] for c in httpx.get(f"{url}/api/runs/{run['id']}/checkpoints").json()] == [1]
    assert sorted(p.name for p in folder.iterdir()) == ["000000001.ckpt", "000000001.json"]


# ---- (3) a run's byte budget: at creation and at run time ---------------------------------------


def test_a_run_past_max_run_bytes_is_refused_at_creation_and_closed_at_run_time(server,
                                                                                  tmp_path):
    data = tmp_path / "data"
    earlier = server(data, **FAST)
    url = earlier.url
    r = httpx.post(url + "/api/runs", json={"preset": "tiny", "steps": 1_000_000,
                                            "batch_size": 1024}, timeout=60)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "ANDREA_MAX_RUN_BYTES" in detail and "1,000,000 steps" in detail
    assert "1,024.0 MiB a run may store" in detail and "ask for at most" in detail
    assert new_run(url, steps=1_000_000)["config"]["steps"] == 1_000_000   # the default shape

    run = new_run(url, batch_size=1024, steps=10_000)
    with connect(ws_url(url, f"/ws/runs/{run['id']}"), max_size=None) as ws:
        assert hello(ws, run["token"])["type"] == "welcome"
        for first in (1, 21, 41):
            ws.send(metrics(first, 20, 1024))
            assert json.loads(ws.recv(timeout=60))["type"] == "ack"
    earlier.stop()

    # 60 records (~0.77 MB as stored) are read from the store at connect; 1 MiB is its budget.
    url = server(data, max_run_bytes=MIB, **FAST).url
    with connect(ws_url(url, f"/ws/runs/{run['id']}"), max_size=None) as ws:
        assert hello(ws, run["token"], 60)["type"] == "welcome"
        acked, close = stream_until_closed(ws, 61, 10, 1024, limit=20)
    message = assert_storage_close(close, RUN_BYTES)
    assert "ANDREA_MAX_RUN_BYTES" in message and "1.0 MiB a run may store" in message
    assert 1 <= len(acked) // 10 <= 3
    assert stored_steps(url, run["id"]) == list(range(1, 61)) + acked


# ---- (4) bytes per second, per run and per client address ----------------------------------------
# ~235 KB and ~113 KB messages at 32 KiB/s with 2 s bursts (64 KiB): a first one waits ~5.3 s,
# a second at once behind it ~7.3 s more, a half one ~3.5 s more. The tests look at the order of
# the acks alone (each apart by seconds from the next), never at a clock.
PACED = 32 << 10


def _connect_from(url: str, path: str, address: str):
    """A websocket whose client address is `address` (another loopback address)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), source_address=(address, 0))
    return connect(ws_url(url, path), sock=sock, max_size=None)


def acks_in_order(sockets: dict[str, tuple]) -> list[str]:
    """Reads its count of acks on each named socket, all at once: the names in the order the
    acks came."""
    order, lock = [], threading.Lock()

    def read(name: str, ws, n: int) -> None:
        for _ in range(n):
            if json.loads(ws.recv(timeout=90))["type"] == "ack":
                with lock:
                    order.append(name)
    threads = [threading.Thread(target=read, args=(name, ws, n))
               for name, (ws, n) in sockets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(order) == sum(n for _, n in sockets.values()), order
    return order


def test_trainer_bytes_per_second_are_bounded_per_run(server, tmp_path):
    """Before: ~1 MiB messages of ~10 KB records passed the records bucket unpaced."""
    url = server(tmp_path / "data", metrics_bytes_per_s=PACED,
                    client_metrics_bytes_per_s=1 << 30).url
    a, b = (new_run(url, batch_size=1024, steps=1000) for _ in range(2))
    with (connect(ws_url(url, f"/ws/runs/{a['id']}"), max_size=None) as wa,
          connect(ws_url(url, f"/ws/runs/{b['id']}"), max_size=None) as wb):
        for ws, run in ((wa, a), (wb, b)):
            assert hello(ws, run["token"])["type"] == "welcome"
        assert 220_000 < len(metrics(1, 25, 1024)) < MAX_MESSAGE_BYTES
        wa.send(metrics(1, 25, 1024))      # acked after ~5.3 s
        wa.send(metrics(26, 25, 1024))    # ~12.6 s
        wb.send(metrics(1, 25, 1024))      # ~5.3 s
        wb.send(metrics(26, 12, 1024))     # ~8.9 s
        order = acks_in_order({"a": (wa, 2), "b": (wb, 2)})
    assert sorted(order[:2]) == ["a", "b"] and order[2:] == ["b", "a"], order
    assert stored_steps(url, a["id"]) == list(range(1, 51))     # nothing lost


def test_trainer_bytes_per_second_are_bounded_per_client_address(server, tmp_path):
    """All trainer sockets of one address share its bucket: two runs from 127.0.0.1 pay for
    each other, one from 127.0.0.2 does not."""
    url = server(tmp_path / "data", metrics_bytes_per_s=1 << 30,
                    client_metrics_bytes_per_s=PACED).url
    a, b, c = (new_run(url, batch_size=1024, steps=1000) for _ in range(3))
    with (connect(ws_url(url, f"/ws/runs/{a['id']}"), max_size=None) as wa,
          connect(ws_url(url, f"/ws/runs/{b['id']}"), max_size=None) as wb,
          _connect_from(url, f"/ws/runs/{c['id']}", "127.0.0.2") as wc):
        for ws, run in ((wa, a), (wb, b), (wc, c)):
            assert hello(ws, run["token"])["type"] == "welcome"
        wa.send(metrics(1, 25, 1024))      # the first of a and b ~5.3 s, the other ~12.6 s
        wb.send(metrics(1, 25, 1024))
        wc.send(metrics(1, 25, 1024))      # ~5.3 s
        wc.send(metrics(26, 12, 1024))     # ~8.9 s
        order = acks_in_order({"a": (wa, 1), "b": (wb, 1), "c": (wc, 2)})
    assert sorted(order[:2]) in (["a", "c"], ["b", "c"]), order
    assert order[2] == "c" and order[3] in ("a", "b"), order
    assert stored_steps(url, c["id"]) == list(range(1, 38))


def test_message_rates_owe_by_bytes_per_run_and_per_client():
    now = [0.0]
    rates = MessageRates(per_run=1000, per_client=4000, clock=lambda: now[0])
    # Bursts of 2 s: 2000 bytes per run, 8000 per client.
    assert rates.wait_s("r1", "10.0.0.1", 2000) == 0
    assert rates.wait_s("r1", "10.0.0.1", 500) == pytest.approx(0.5)   # the run owes 500
    assert rates.wait_s("r2", "10.0.0.1", 2000) == 0                   # another run: its own
    assert rates.wait_s("r3", "10.0.0.1", 2000) == 0
    assert rates.wait_s("r4", "10.0.0.1", 2000) == pytest.approx(0.125)  # the client owes 500
    assert rates.wait_s("r5", "10.0.0.2", 2000) == 0                   # another client
    assert rates.paced == 2
    now[0] = 10.0          # all paid back and full again
    assert rates.wait_s("r1", "10.0.0.1", 2000) == 0
    # N bytes at R bytes/s past the burst owe (N - burst) / R seconds, wherever they come from.
    waits = [rates.wait_s("r6", f"10.0.1.{i}", 1000) for i in range(10)]
    assert waits[-1] == pytest.approx((10 * 1000 - 2000) / 1000)


# ---- (5) the budget's arithmetic -----------------------------------------------------------------


def test_the_budget_reserves_counts_and_reads_the_disk_again():
    """The fake disk has what was written on it, as a real one would."""
    disk, now, pages = [100 * MIB], [0.0], [0]

    async def free_pages() -> int:
        return pages[0]

    async def scenario():
        budget = StorageBudget(Path("/data"), 50 * MIB, free_pages=free_pages,
                               disk_free=lambda: disk[0], clock=lambda: now[0])
        one = await budget.reserve(30 * MIB, "checkpoint 1")
        with pytest.raises(DiskFull) as refused:            # 100 - 30 - 30 < 50
            await budget.reserve(30 * MIB, "checkpoint 2")
        assert refused.value.retry_after_s == FULL_RETRY_S       # (507 with Retry-After)
        assert "30.0 MiB of it promised to uploads in progress" in str(refused.value)
        one.wrote(10 * MIB)              # written: no longer promised, counted as spent
        assert (budget.reserved, budget.spent) == (20 * MIB, 10 * MIB)
        disk[0] = 90 * MIB
        with pytest.raises(StorageFull) as full:             # rows: 90 - 20 - 21 < 50
            await budget.take(21 * MIB, "this message")
        assert full.value.kind == FLOOR and str(full.value).startswith("disk_floor: ")
        assert budget.spent == 0         # (read again before refusing: 10 MiB are on the disk)
        await budget.take(20 * MIB, "this message")          # exactly at the floor
        assert budget.spent == 20 * MIB
        disk[0] = 70 * MIB               # committed
        one.release()
        one.release()                    # (again: nothing)
        assert budget.reserved == 0
        now[0] = 1.0                     # read again: spent starts over
        await budget.refresh()
        assert (budget.disk, budget.spent) == (70 * MIB, 0)
        with pytest.raises(StorageFull):
            await budget.take(21 * MIB, "this message")
        pages[0] = 40 * MIB              # a delete left free pages: rows may use them...
        now[0] = 2.0
        await budget.take(21 * MIB, "this message")
        with pytest.raises(DiskFull):                       # ...files may not
            await budget.reserve(21 * MIB, "the weights")
        with pytest.raises(DiskFull) as run:
            await budget.check_run(100 * MIB, "10 steps x ~10 MB")
        assert "whose records would take about 100.0 MiB (10 steps" in str(run.value)
        await budget.check_run(1 * MIB, "1 step")
    aio.run(scenario())


# ---- (6) what a record takes in the store --------------------------------------------------------


def _stored_per_record(path: Path, records: list[dict]) -> tuple[float, float]:
    """(the estimate, SQLite's used pages) per record, for these records in a fresh store."""
    store = Store(path)
    store.runs.create("r", stored_config(), "h")
    estimate = 0.0
    for i in range(0, len(records), 250):
        chunk = records[i:i + 250]
        wire = len(json.dumps({"type": "metrics", "records": chunk}, separators=(",", ":")))
        parsed = [Record.model_validate(r) for r in chunk]
        estimate += message_bytes(parsed, wire)
        store.metrics.add("r", [r.row() for r in parsed])
    rows, extra = store.metrics.usage("r")
    assert rows == len(records)
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        used = (db.execute("PRAGMA page_count").fetchone()[0]
                - db.execute("PRAGMA freelist_count").fetchone()[0]) * 4096
    return estimate / len(records), used / len(records)


@pytest.mark.parametrize("batch,tensors", [(8, 20), (64, 0), (256, 0), (1024, 0), (8, 578)])
def test_the_estimate_of_a_record_holds_to_the_store(tmp_path, batch, tensors):
    records = [{**big_record(s, batch), "source_losses": {"0": 4.1234567, "1": 4.2345678},
                **({"tensor_grad_norms": [round(0.001 + i / 1e5, 9) for i in range(tensors)]}
                   if tensors else {})} for s in range(1, 1001)]
    estimate, stored = _stored_per_record(tmp_path / "s.sqlite", records)
    assert 0.85 <= estimate / stored <= 1.2, (estimate, stored)
    # A run's estimate from its config, for records of that shape, is no less.
    assert estimated_run_bytes(1, batch, tensors, 2) >= 0.85 * stored


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_runs_stored_records_are_read_cheaply_from_either_store(request, tmp_path, db):
    store = (Store(tmp_path / "s.sqlite") if db == "sqlite"
             else Store(url=request.getfixturevalue("pg_url")))
    try:
        store.runs.create("u", stored_config(), "h")
        assert store.metrics.usage("u") == (0, 0.0)
        store.metrics.add("u", [Record.model_validate(big_record(s, 8)).row()
                                for s in range(5, 15)])
        rows, extra = store.metrics.usage("u")
        assert rows == 10 and 80 < extra < 120       # {"row_losses": [8 numbers]}
        store.metrics.add("u", [Record.model_validate(big_record(s, 1024)).row()
                                for s in range(100, 150)])     # rows of overflow pages
        store.runs.delete("u")
        freed = store.db.free_page_bytes()     # SQLite's free pages; none on PostgreSQL
        assert freed == 0 if db == "postgresql" else freed > 0
    finally:
        store.close()


# ---- a full disk, told to the trainer and the API ---------------------------------------


def test_a_full_disk_is_told_to_the_trainer_and_the_api(tmp_path):
    data = tmp_path / "data"
    with serve(data) as s:
        run = new_run(s.url, steps=100_000)
    with serve(data, file_limit=1 << 20) as s:                # no file past 1 MiB: the WAL fills up
        url = s.url
        with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
            hello(ws, run["token"])
            with pytest.raises(ConnectionClosed) as e:
                for i in range(1, 100_000, 2000):
                    ws.send(json.dumps({"type": "metrics", "records": [
                        record(s) for s in range(i, i + 2000)]}))
                    msg = json.loads(ws.recv(timeout=30))
                    if msg["type"] == "error":
                        error = msg["message"]
            assert e.value.rcvd.code == 1013
        assert "andrea.sqlite" in error and "kept" in error, error
        # Small writes may still fit in what the failed batch left; once nothing fits, the API
        # says why with a 503 (never a bare 500).
        for _ in range(400):
            r = httpx.post(url + "/api/runs", json={"preset": "tiny"})
            if r.status_code != 201:
                break
        assert r.status_code == 503 and "andrea.sqlite" in r.json()["detail"], r.text
