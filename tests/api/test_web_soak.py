"""Hostile soak (about 30 s, loopback only): three participants train their runs while every
hostile client of the workshop findings runs at once: tokenless take-overs, deletes and renames
under a LAN name, cross-site posts, 200 MiB bodies, trickled request heads, a run-creation
flood, far-step bandit batches, list/metrics readers, and a sample flood on the attacker's own
run. At the end every record the trainers sent is stored exactly once, their runs are as they
made them, /healthz answered throughout, every hostile request got a clear refusal, and the
server's memory stayed flat."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.cli.launch import start_server, stop_server
from tests.trainer_client import new_run, record, rss_mib, send_records, ws_url

STEPS, PER = 6000, 100              # a trainer's records, in batches of PER every ~0.1 s
LAN = "workshop.lan"                # a name that is not loopback: no local convenience
RSS_GROWTH_MIB = 150
ENV = {"ANDREA_ALLOWED_HOSTS": LAN, "ANDREA_HEADER_TIMEOUT_S": "1", "ANDREA_IDLE_TIMEOUT_S": "3",
       "ANDREA_RUN_BURST": "5", "ANDREA_MAX_SAMPLES_PER_RUN": "40",
       # Every client here shares 127.0.0.1: the per-address cap must leave room for all.
       "ANDREA_MAX_CONNECTIONS_PER_CLIENT": "400"}


class Loop(threading.Thread):
    """Calls `once()` until stopped; what it returns (a status, or a word) is counted."""

    def __init__(self, once, stop: threading.Event):
        super().__init__(daemon=True)
        self.once, self.stop, self.seen, self.errors = once, stop, {}, []

    def run(self):
        while not self.stop.is_set():
            try:
                got = self.once()
            except Exception as e:          # counted, not raised: the soak goes on
                got = type(e).__name__
            self.seen[got] = self.seen.get(got, 0) + 1


class Trainer(threading.Thread):
    def __init__(self, url, run):
        super().__init__(daemon=True)
        self.url, self.run_info, self.acked, self.error = url, run, 0, None

    def run(self):
        deadline = time.monotonic() + 100
        while self.acked < STEPS and time.monotonic() < deadline:
            try:
                with connect(ws_url(self.url, f"/ws/runs/{self.run_info['id']}"),
                             open_timeout=5) as ws:
                    ws.send(json.dumps({"type": "hello", "token": self.run_info["token"],
                                        "last_acked_step": self.acked or None}))
                    welcome = json.loads(ws.recv(timeout=10))
                    assert welcome["type"] == "welcome", welcome
                    self.acked = welcome["last_committed_step"] or 0
                    send_records(ws, self.acked + 1, STEPS, PER, record, 0.1,
                                 lambda step: setattr(self, "acked", step))
            except (OSError, ConnectionClosed, TimeoutError):
                time.sleep(0.3)
            except AssertionError as e:
                self.error = e
                return


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _big_body(url: str) -> str:
    """POST /api/runs announcing 200 MiB, sending 64 KiB: the status line of the answer."""
    with _raw(url) as s:
        s.sendall(b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json"
                  b"\r\ncontent-length: 209715200\r\n\r\n" + b" " * (64 << 10))
        try:
            return s.recv(64).split(b"\r\n")[0].decode().split(" ")[1]
        except (OSError, IndexError):
            return "dropped"


def _trickle(url: str) -> str:
    """A request head a byte a second (slowloris): 'closed' once the server drops it."""
    with _raw(url) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        s.settimeout(1.0)
        for _ in range(20):         # 20 s: far past the server's 1 s for a request head
            try:
                s.sendall(b"X")
                s.recv(64)          # EOF or an error answer: the server ended the wait
                return "closed"
            except TimeoutError:
                continue
            except OSError:
                return "closed"
        return "held"


def _sample_flood(url: str, run: dict, stop: threading.Event) -> list[dict]:
    """The attacker's own run and token: samples of 20 KB as fast as the socket takes them."""
    notices = []
    with connect(ws_url(url, f"/ws/runs/{run['id']}"), open_timeout=5) as ws:
        ws.send(json.dumps({"type": "hello", "token": run["token"], "last_acked_step": None}))
        json.loads(ws.recv(timeout=10))
        step = 0
        while not stop.is_set() and step < 2000:
            step += 1
            ws.send(json.dumps({"type": "sample", "step": step % 100 + 1, "text": "x" * 20_000}))
            try:
                while True:
                    notices.append(json.loads(ws.recv(timeout=0)))
            except TimeoutError:
                pass
    return notices


def test_hostile_soak(tmp_path):
    data = tmp_path / "data"
    proc, url = start_server(data, env=ENV)
    lan = {"host": f"{LAN}:{url.rsplit(':', 1)[1]}"}
    stop = threading.Event()
    try:
        runs = [new_run(url, steps=STEPS) for _ in range(3)]
        bandit = new_run(url, steps=STEPS, data_mode="bandit")
        attacker = new_run(url, steps=STEPS)
        # The corpus is tokenized on the first batch (seconds): done before the attack.
        httpx.get(f"{url}/api/runs/{bandit['id']}/batches/0", timeout=180).raise_for_status()
        base = rss_mib(proc.pid)
        # Idle connections dropped well before the server's keep-alive timeout (5 s, as
        # httpx's own default): reusing one the server is closing just then reads no answer
        # at all (ReadError), a race of the client's, not a refusal.
        http = httpx.Client(timeout=30, limits=httpx.Limits(keepalive_expiry=1))
        victim = runs[0]["id"]

        def takeover():
            for method, path, body in (("POST", "/resume", None), ("DELETE", "", None),
                                       ("PATCH", "", {"name": "pwned"})):
                r = http.request(method, f"{url}/api/runs/{victim}{path}", json=body,
                                 headers=lan)
                if r.status_code not in (401, 403):
                    return f"{method} {r.status_code}"
            return "refused"

        def cross_site():
            r = http.post(f"{url}/api/runs/{victim}/resume", content=b"{}", headers={
                "origin": "http://evil.example", "content-type": "text/plain"})
            return r.status_code

        def flood():
            return http.post(url + "/api/runs", json={"preset": "tiny"}).status_code

        far = iter(range(10**9))

        def far_batch():    # waits for reports that never come (3000), or too far (5999)
            step = 3000 if next(far) % 2 else STEPS - 1
            return http.get(f"{url}/api/runs/{bandit['id']}/batches/{step}").status_code

        def read():
            http.get(url + "/api/runs").raise_for_status()
            return http.get(f"{url}/api/runs/{runs[1]['id']}/metrics?format=csv").status_code

        healthz_failures = []

        def healthz():
            try:
                return httpx.get(url + "/healthz", timeout=5).status_code
            except httpx.HTTPError as e:
                healthz_failures.append(repr(e))
                return "failed"
            finally:
                time.sleep(0.2)

        loops = ([Loop(f, stop) for f in (takeover, cross_site, flood, read, healthz)]
                 + [Loop(lambda: _big_body(url), stop) for _ in range(4)]
                 + [Loop(lambda: _trickle(url), stop) for _ in range(20)]
                 + [Loop(far_batch, stop) for _ in range(20)])
        trainers = [Trainer(url, r) for r in runs]
        for t in loops + trainers:
            t.start()
        notices = _sample_flood(url, attacker, stop)
        peak, started = base, time.monotonic()
        while any(t.is_alive() for t in trainers):
            assert time.monotonic() - started < 110, "the trainers did not finish in time"
            peak = max(peak, rss_mib(proc.pid))
            time.sleep(0.25)
        stop.set()
        for t in loops:
            t.join(timeout=40)
        takeovers, cross, floods, bigs, trickles, fars, healths = (
            loops[0].seen, loops[1].seen, loops[2].seen, {}, {}, {}, loops[4].seen)
        for t in loops[5:9]:
            for k, v in t.seen.items():
                bigs[k] = bigs.get(k, 0) + v
        for t in loops[9:29]:
            for k, v in t.seen.items():
                trickles[k] = trickles.get(k, 0) + v
        for t in loops[29:]:
            for k, v in t.seen.items():
                fars[k] = fars.get(k, 0) + v
        print(f"hostile soak: RSS base {base:.0f} MiB, peak {peak:.0f} MiB; take-overs "
              f"{takeovers}; cross-site {cross}; flood {floods}; bodies {bigs}; trickles "
              f"{trickles}; far batches {fars}; healthz {healths}; sample notices "
              f"{len(notices)}")

        # The participants' work: every record once, their runs as they made them.
        assert all(t.error is None and t.acked == STEPS for t in trainers), \
            [(t.acked, t.error) for t in trainers]
        db = sqlite3.connect(data / "andrea.sqlite")
        for r in runs:
            assert db.execute("SELECT COUNT(*), COUNT(DISTINCT step) FROM metrics "
                              "WHERE run_id = ?", (r["id"],)).fetchone() == (STEPS, STEPS)
            got = httpx.get(f"{url}/api/runs/{r['id']}")
            assert got.status_code == 200 and got.json()["name"] != "pwned", got.text
        # Each hostile client got a clear refusal, never a change.
        assert set(takeovers) == {"refused"}, takeovers
        assert set(cross) == {403}, cross
        assert set(floods) <= {201, 429} and floods.get(429, 0) > 0, floods
        assert set(bigs) <= {"413"} and bigs, bigs
        assert set(trickles) == {"closed"}, trickles
        assert set(fars) == {503}, fars
        assert not healthz_failures and set(healths) == {200}, (healthz_failures, healths)
        samples = db.execute("SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = 'sample'",
                             (attacker["id"],)).fetchone()[0]
        assert samples <= 40 and any(n.get("type") == "notice" or "quota" in json.dumps(n)
                                     for n in notices), (samples, notices[:3])
        assert peak < base + RSS_GROWTH_MIB, f"server RSS {base:.0f} -> {peak:.0f} MiB"
    finally:
        stop.set()
        stop_server(proc)
