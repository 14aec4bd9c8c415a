"""Soak (about a minute): trainer clients speaking the protocol (hello with token, metrics
batches, acks, resend after a reconnect), fast, slow and silent viewers, and a server restart
in the middle. At the end every record is stored exactly once, the fast viewers saw every
step, and the server's memory (VmRSS) stayed within a stated bound the whole time."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.cli.launch import free_port, start_server, stop_server
from tests.trainer_client import raw_ws, record, rss_mib, send_records

RUNS, STEPS, PER = 3, 24_000, 250          # 250 records every ~0.2 s per trainer
SILENT, SLOW, FAST = 12, 3, 6
RSS_GROWTH_MIB = 100                       # over the first server's RSS once the runs exist


class Trainer(threading.Thread):
    def __init__(self, url, run):
        super().__init__(daemon=True)
        self.url, self.info, self.acked, self.error = url, run, None, None

    def run(self):
        deadline = time.monotonic() + 110
        while (self.acked or 0) < STEPS and time.monotonic() < deadline:
            try:
                with connect(self.url.replace("http", "ws") + f"/ws/runs/{self.info['id']}",
                             open_timeout=5) as ws:
                    ws.send(json.dumps({"type": "hello", "token": self.info["token"],
                                        "last_acked_step": self.acked}))
                    welcome = json.loads(ws.recv(timeout=10))
                    assert welcome["type"] == "welcome", welcome
                    committed = welcome["last_committed_step"] or 0
                    self.acked = committed
                    # Resend what was not committed.
                    send_records(ws, committed + 1, STEPS, PER, record, 0.2,
                                 lambda step: setattr(self, "acked", step))
            except (OSError, ConnectionClosed, TimeoutError):
                time.sleep(0.3)                         # the server restarts: come back
            except AssertionError as e:
                self.error = e
                return


class Viewer(threading.Thread):
    def __init__(self, url, run_id, pause=0.0):
        super().__init__(daemon=True)
        self.url, self.run_id, self.pause = url, run_id, pause
        self.steps: set[int] = set()
        self.last, self.stop, self.closes = None, False, []

    def run(self):
        while not self.stop:
            after = "" if self.last is None else f"?after={self.last}"
            try:
                with connect(self.url.replace("http", "ws") +
                             f"/ws/runs/{self.run_id}/watch{after}", open_timeout=5) as ws:
                    while not self.stop:
                        msg = json.loads(ws.recv(timeout=5))
                        if msg["type"] == "records" and msg["records"]:
                            self.steps.update(r["step"] for r in msg["records"])
                            self.last = max(self.last or 0, msg["records"][-1]["step"])
                            if self.last >= STEPS:
                                return
                        if self.pause:
                            time.sleep(self.pause)
            except ConnectionClosed as e:
                self.closes.append(e.rcvd.code if e.rcvd else None)
                time.sleep(0.2)
            except (OSError, TimeoutError):
                time.sleep(0.3)


def test_soak(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_VIEWER_SEND_TIMEOUT_S", "3")
    monkeypatch.setenv("ANDREA_VIEWER_QUEUE_BYTES", str(256 << 10))
    # Every viewer here shares 127.0.0.1: the per-address viewer bounds must leave room for all.
    monkeypatch.setenv("ANDREA_MAX_VIEWERS_PER_CLIENT", "100")
    monkeypatch.setenv("ANDREA_VIEWER_BACKLOG_BURST_BYTES", str(1 << 30))
    data, port = tmp_path / "data", free_port()
    proc, url = start_server(data, port)
    peak, samples = [0.0], []
    try:
        runs = [httpx.post(url + "/api/runs", json={"preset": "tiny", "steps": STEPS}).json()
                for _ in range(RUNS)]
        base = rss_mib(proc.pid)
        trainers = [Trainer(url, r) for r in runs]
        viewers = [Viewer(url, r["id"]) for r in runs for _ in range(FAST // RUNS)]
        slow = [Viewer(url, runs[i % RUNS]["id"], pause=0.5) for i in range(SLOW)]
        silent = [raw_ws(url, f"/ws/runs/{runs[i % RUNS]['id']}/watch") for i in range(SILENT)]
        for t in trainers + viewers + slow:
            t.start()
        started = time.monotonic()
        restarted = False
        while any(t.is_alive() for t in trainers):
            assert time.monotonic() - started < 115, "the soak did not finish in time"
            rss = rss_mib(proc.pid)
            peak[0] = max(peak[0], rss)
            samples.append(round(rss))
            if not restarted and time.monotonic() - started > 12:
                stop_server(proc)                     # a restart mid-run, same port
                proc, url = start_server(data, port)
                restarted = True
                silent += [raw_ws(url, f"/ws/runs/{r['id']}/watch") for r in runs]
            time.sleep(0.25)
        # Silent viewers on the finished runs (their whole backlogs): memory stays flat.
        silent += [raw_ws(url, f"/ws/runs/{r['id']}/watch") for r in runs for _ in range(8)]
        for _ in range(12):
            peak[0] = max(peak[0], rss_mib(proc.pid))
            time.sleep(0.25)
        for v in viewers:
            v.join(timeout=30)
        for v in slow:
            v.stop = True
        for s in silent:
            s.close()
        assert restarted
        assert all(t.error is None for t in trainers), [t.error for t in trainers]
        for r in runs:
            rows = httpx.get(f"{url}/api/runs/{r['id']}/metrics", timeout=60).json()
            assert [x["step"] for x in rows] == list(range(1, STEPS + 1)), r["id"]
        db = sqlite3.connect(data / "andrea.sqlite")
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT run_id || ':' || step) FROM metrics"
                          ).fetchone() == (RUNS * STEPS, RUNS * STEPS)
        for v in viewers:                             # through drops, reconnects, a restart
            assert v.steps == set(range(1, STEPS + 1)), (len(v.steps), v.closes)
        print(f"soak: RSS base {base:.0f} MiB, peak {peak[0]:.0f} MiB; samples {samples[::8]}")
        assert peak[0] < base + RSS_GROWTH_MIB, f"server RSS {base:.0f} -> {peak[0]:.0f} MiB"
    finally:
        stop_server(proc)
