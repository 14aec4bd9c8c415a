"""The server's access log: a training tab fetches a batch every step (and eval batches), and
uvicorn logged each fetch at INFO, so a run flooded `andrea serve`'s output. Batch fetches that
succeed are left out, in one process and with --workers; everything else is logged as before,
refused batch fetches included."""

from __future__ import annotations

import contextlib
import logging

import httpx
import pytest

from andrea.cli.launch import start_server, stop_server
from tests.redis_server import INSTALL, redis_binary, redis_server


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.db)])  # 2: Redis
def test_batch_fetches_leave_the_access_log_and_the_rest_stays(tmp_path, workers):
    env, args = {}, ()
    with contextlib.ExitStack() as stack:
        if workers > 1:     # each worker process builds its app (create_app) and logs its own
            if redis_binary() is None:
                pytest.skip(f"--workers needs a broker: {INSTALL}")
            env = {"ANDREA_BROKER_URL": stack.enter_context(redis_server())}
            args = ("--workers", str(workers))
        proc, url = start_server(tmp_path / "data", env=env, args=args)
        try:
            run = httpx.post(f"{url}/api/runs", json={"preset": "tiny", "steps": 5,
                                                      "batch_size": 2, "seq_len": 32}).json()
            base = f"{url}/api/runs/{run['id']}"
            for step in (0, 1, 2, 3):       # over both workers, likely
                assert httpx.get(f"{base}/batches/{step}", timeout=300).status_code == 200
            assert httpx.get(f"{base}/val_batches/0", timeout=300).status_code == 200
            assert httpx.get(f"{url}/api/batches/1?seq_len=32&batch_size=2",
                             timeout=300).status_code == 200      # the lab's ad-hoc batches
            assert httpx.get(f"{base}/batches/{2**32}").status_code == 422   # refused: logged
            assert httpx.get(base).status_code == 200
        finally:
            stop_server(proc)
    log = (tmp_path / "data" / "server.log").read_text()
    assert '"POST /api/runs HTTP/1.1" 201' in log, log
    assert f'"GET /api/runs/{run["id"]} HTTP/1.1" 200' in log, log
    refused = f'"GET /api/runs/{run["id"]}/batches/{2**32} HTTP/1.1" 422'
    assert [ln for ln in log.splitlines() if "batches/" in ln and refused not in ln] == [], log
    assert refused in log, log


def test_the_filter_survives_uvicorn_configuring_its_logging(tmp_path):
    """uvicorn configures logging (dictConfig) when a Config is made, before or after the app
    is built: `andrea serve` builds the app first, a worker process after."""
    import uvicorn

    from andrea.app import QuietBatchFetches, create_app
    from andrea.config import Settings

    access = logging.getLogger("uvicorn.access")
    create_app(Settings(data_dir=tmp_path / "a"))
    create_app(Settings(data_dir=tmp_path / "b"))
    uvicorn.Config("andrea.app:create_app", factory=True, log_level="info").configure_logging()
    quiet = [f for f in access.filters if isinstance(f, QuietBatchFetches)]
    assert len(quiet) == 1, access.filters       # once, however many apps a process builds

    def record(path: str, status: int) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                                 '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET", path, "1.1",
                                                             status), None)

    assert not quiet[0].filter(record("/api/runs/ab12/batches/7", 200))
    assert not quiet[0].filter(record("/api/runs/ab12/val_batches/0", 200))
    assert not quiet[0].filter(record("/api/val_batches/0?seq_len=32", 200))
    assert quiet[0].filter(record("/api/runs/ab12/batches/7", 409))
    assert quiet[0].filter(record("/api/runs/ab12", 200))
    assert quiet[0].filter(record("/api/runs/ab12/batches", 200))
    assert quiet[0].filter(record("/runs/ab12/batches/7", 200))     # a page, not the API
