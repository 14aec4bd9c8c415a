"""Two server processes behind one store and one broker (Redis) serve one set of runs: a
trainer client streams to process A, a viewer watches on process B; A is killed mid-stream
(SIGKILL: nothing flushed, nothing said) and the trainer reconnects to B and resends what was
not acknowledged. The viewer must see every step once and the store hold each step once.
Run on PostgreSQL (past one machine) and on a shared SQLite file (several processes on one
machine). Each server is a real `andrea serve` process; the Redis and PostgreSQL servers are
throwaway ones that the test starts itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from andrea.cli.launch import free_port, start_server, stop_server
from andrea.data.bandit import PhaseSchedule
from andrea.data.spec import BatchSpec
from andrea.run_config import StoredRunConfig
from tests.redis_server import INSTALL, redis_binary, redis_server
from tests.trainer_client import new_run, record, send_records, ws_url

pytestmark = pytest.mark.db   # every test here shares its runs through Redis

STEPS, PER = 400, 8                    # 8 records per message, a message every 20 ms
KILL_AFTER = 150                       # A dies once this step is acknowledged


@pytest.fixture(scope="module")
def redis_url():
    if redis_binary() is None:
        pytest.skip(f"redis-server is not installed ({INSTALL}; bash scripts/test does it)")
    with redis_server() as url:
        yield url


@pytest.fixture(params=["postgresql", "sqlite"])
def store_env(request, redis_url) -> dict[str, str]:
    env = {"ANDREA_BROKER_URL": redis_url}
    if request.param == "postgresql":
        env["ANDREA_DATABASE_URL"] = request.getfixturevalue("pg_url")
    return env


class Trainer(threading.Thread):
    """The page's protocol: hello with the last acknowledged step, resend from the server's
    last committed step, keep records until acknowledged; on a dropped connection, the next
    server (a reconnect through a load balancer lands on another process)."""

    def __init__(self, urls: list[str], run: dict):
        super().__init__(daemon=True)
        self.urls, self.run_info = urls, run
        self.acked: int | None = None
        self.error: BaseException | None = None
        self.hellos: list[tuple[str, str]] = []      # (url, what the server answered)

    def run(self):
        try:
            self._train()
        except BaseException as e:       # reported by the test
            self.error = e

    def _train(self):
        deadline, server = time.monotonic() + 120, 0
        while (self.acked or 0) < STEPS:
            assert time.monotonic() < deadline, f"trainer stuck at {self.acked}: {self.hellos}"
            url = self.urls[server]
            try:
                with connect(ws_url(url, f"/ws/runs/{self.run_info['id']}"),
                             open_timeout=5) as ws:
                    ws.send(json.dumps({"type": "hello", "token": self.run_info["token"],
                                        "last_acked_step": self.acked}))
                    welcome = json.loads(ws.recv(timeout=10))
                    self.hellos.append((url, welcome["type"]))
                    if welcome["type"] != "welcome":
                        raise ConnectionError(welcome.get("message"))
                    self.acked = welcome["last_committed_step"]
                    send_records(ws, (self.acked or 0) + 1, STEPS, PER, record, 0.02,
                                 lambda step: setattr(self, "acked", step))
            except (OSError, ConnectionClosed, TimeoutError, ConnectionError):
                # A killed process: the next one. "another trainer holds this run": the dead
                # process's claim expires within seconds; try again.
                server = min(server + 1, len(self.urls) - 1)
                time.sleep(0.3)


class Viewer(threading.Thread):
    def __init__(self, url: str, run_id: str):
        super().__init__(daemon=True)
        self.url, self.run_id = url, run_id
        self.counts: dict[int, int] = {}
        self.error: BaseException | None = None

    def run(self):
        try:
            with connect(ws_url(self.url, f"/ws/runs/{self.run_id}/watch"),
                         open_timeout=5) as ws:
                while len(self.counts) < STEPS:
                    msg = json.loads(ws.recv(timeout=30))
                    for r in msg.get("records", []) if msg["type"] == "records" else []:
                        self.counts[r["step"]] = self.counts.get(r["step"], 0) + 1
        except BaseException as e:
            self.error = e


def test_two_processes_one_set_of_runs_and_a_killed_process(tmp_path, store_env):
    data = tmp_path / "data"
    a, url_a = start_server(data, env=store_env)
    b, url_b = start_server(data, env=store_env)
    try:
        run = new_run(url_a, steps=STEPS)
        # B knows the run A created (one store), and hears A's records (one broker).
        assert httpx.get(f"{url_b}/api/runs/{run['id']}").status_code == 200
        viewer = Viewer(url_b, run["id"])
        viewer.start()
        time.sleep(0.5)                       # subscribed before the first record
        trainer = Trainer([url_a, url_b], run)
        trainer.start()
        deadline = time.monotonic() + 60
        while (trainer.acked or 0) < KILL_AFTER:
            assert trainer.is_alive() and time.monotonic() < deadline, trainer.error
            time.sleep(0.01)
        a.kill()                              # mid-stream, no goodbye
        a.wait()
        trainer.join(timeout=120)
        viewer.join(timeout=30)
        assert trainer.error is None, trainer.error
        assert trainer.acked == STEPS
        assert [h for h in trainer.hellos if h[1] == "welcome"][-1][0] == url_b, trainer.hellos
        assert viewer.error is None, viewer.error
        missing = sorted(set(range(1, STEPS + 1)) - set(viewer.counts))
        twice = sorted(s for s, n in viewer.counts.items() if n > 1)
        assert not missing and not twice, (missing[:10], twice[:10])
        rows = httpx.get(f"{url_b}/api/runs/{run['id']}/metrics", timeout=30).json()
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        # The trainer's socket on B counts as connected on B, for every process.
        info = httpx.get(f"{url_b}/api/runs/{run['id']}").json()
        assert info["id"] == run["id"]
    finally:
        stop_server(b)
        if a.poll() is None:
            stop_server(a)


def test_one_trainer_per_run_across_processes(tmp_path, store_env):
    """A second trainer on the other process is refused while the first is connected, and a
    resume on the other process is refused too (the presence is in the broker)."""
    data = tmp_path / "data"
    a, url_a = start_server(data, env=store_env)
    b, url_b = start_server(data, env=store_env)
    try:
        run = new_run(url_a, steps=50)
        with connect(ws_url(url_a, f"/ws/runs/{run['id']}"), open_timeout=5) as first:
            first.send(json.dumps({"type": "hello", "token": run["token"]}))
            assert json.loads(first.recv(timeout=10))["type"] == "welcome"
            with connect(ws_url(url_b, f"/ws/runs/{run['id']}"), open_timeout=5) as second:
                second.send(json.dumps({"type": "hello", "token": run["token"]}))
                msg = json.loads(second.recv(timeout=10))
                assert msg["type"] == "error" and "another trainer" in msg["message"], msg
            r = httpx.delete(f"{url_b}/api/runs/{run['id']}")
            assert r.status_code == 409, r.text
            r = httpx.post(f"{url_b}/api/runs/{run['id']}/resume")
            assert r.status_code == 409 and "trainer is connected" in r.text, r.text
        # Gone from A: B may take it at once (A released its claim).
        with connect(ws_url(url_b, f"/ws/runs/{run['id']}"), open_timeout=5) as again:
            again.send(json.dumps({"type": "hello", "token": run["token"]}))
            assert json.loads(again.recv(timeout=10))["type"] == "welcome"
    finally:
        stop_server(a)
        stop_server(b)


def test_bandit_on_one_process_hears_the_trainer_on_another(tmp_path, store_env):
    """A bandit run's batches come from B while its telemetry goes to A: B's bandit reads the
    reports it waits for from the store instead of timing out (503)."""
    data = tmp_path / "data"
    a, url_a = start_server(data, env=store_env)
    b, url_b = start_server(data, env=store_env)
    try:
        run = new_run(url_a, steps=200, data_mode="bandit")
        batch = f"{url_b}/api/runs/{run['id']}/batches"
        assert httpx.get(f"{batch}/1", timeout=120).status_code == 200   # B's bandit exists
        schedule = PhaseSchedule(BatchSpec.of_run(StoredRunConfig.model_validate(
            run["config"])).seed)
        later = schedule.phase(3)[0]           # decided from the reports of phases 0 and 1
        with connect(ws_url(url_a, f"/ws/runs/{run['id']}"), open_timeout=5) as ws:
            ws.send(json.dumps({"type": "hello", "token": run["token"]}))
            assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
            ws.send(json.dumps({"type": "metrics", "records": [
                {**record(s), "source_losses": {"0": 5.0 - s / 100, "1": 4.0}}
                for s in range(1, later)]}))
            assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "step": later - 1}
            r = httpx.get(f"{batch}/{later}", timeout=60)
            assert r.status_code == 200, r.text
    finally:
        stop_server(a)
        stop_server(b)


def test_a_broker_restart_loses_no_record_for_viewers(tmp_path):
    """Redis goes away mid-stream and comes back empty: the viewer on the other process
    still gets every step once (what was published meanwhile is re-read from the store)."""
    if redis_binary() is None:
        pytest.skip(f"redis-server is not installed ({INSTALL}; bash scripts/test does it)")
    port = free_port()
    broker = redis_server(port)
    env = {"ANDREA_BROKER_URL": broker.__enter__()}
    data = tmp_path / "data"
    a, url_a = start_server(data, env=env)
    b, url_b = start_server(data, env=env)
    try:
        run = new_run(url_a, steps=STEPS)
        viewer = Viewer(url_b, run["id"])
        viewer.start()
        time.sleep(0.5)
        trainer = Trainer([url_a], run)
        trainer.start()
        deadline = time.monotonic() + 60
        while (trainer.acked or 0) < KILL_AFTER:
            assert trainer.is_alive() and time.monotonic() < deadline, trainer.error
            time.sleep(0.01)
        broker.__exit__(None, None, None)          # Redis gone, and with it every key
        time.sleep(1.5)
        broker = redis_server(port)
        broker.__enter__()
        trainer.join(timeout=120)
        viewer.join(timeout=30)
        assert trainer.error is None and trainer.acked == STEPS, trainer.error
        assert viewer.error is None, viewer.error
        missing = sorted(set(range(1, STEPS + 1)) - set(viewer.counts))
        twice = sorted(s for s, n in viewer.counts.items() if n > 1)
        assert not missing and not twice, (missing[:10], twice[:10])
    finally:
        stop_server(a)
        stop_server(b)
        broker.__exit__(None, None, None)


def test_serve_workers_shares_one_port(tmp_path, redis_url):
    """`andrea serve --workers 2`: two processes on one port; viewers connected to either
    process (the kernel spreads connections) see every record of a trainer on one of them."""
    port = free_port()
    cmd = [sys.executable, "-m", "andrea", "serve", "--port", str(port), "--data-dir",
           str(tmp_path / "data"), "--no-warm-data", "--workers", "2"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items()
                                  if k != "ANDREA_BROKER_URL"})
    assert refused.returncode == 2 and "ANDREA_BROKER_URL" in refused.stderr
    proc = subprocess.Popen(cmd, env={**os.environ, "ANDREA_BROKER_URL": redis_url},
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        pids = set()
        while len(pids) < 2:        # both workers answer (each says which process it is)
            assert proc.poll() is None and time.monotonic() < deadline, "workers never came up"
            try:
                pids.add(httpx.get(url + "/healthz", timeout=2).json()["pid"])
            except httpx.HTTPError:
                time.sleep(0.2)
        run = new_run(url, steps=STEPS)
        viewers = [Viewer(url, run["id"]) for _ in range(6)]
        for v in viewers:
            v.start()
        time.sleep(0.5)
        trainer = Trainer([url], run)
        trainer.start()
        trainer.join(timeout=60)
        assert trainer.error is None and trainer.acked == STEPS, trainer.error
        for v in viewers:
            v.join(timeout=30)
            assert v.error is None and sorted(v.counts) == list(range(1, STEPS + 1))
            assert set(v.counts.values()) == {1}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
