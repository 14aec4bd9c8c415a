"""bench/load.py at a tiny scale (a few seconds) against a real server started here: every
record is stored and seen by every viewer exactly once, and every figure of the report is
there. The big measurements are made by hand with the same tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from andrea.cli.launch import start_server, stop_server

TOOL = Path(__file__).resolve().parents[2] / "bench" / "load.py"


def _tool(*args: str, timeout: float = 50) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_tiny_load_loses_and_duplicates_nothing(tmp_path):
    proc, url = start_server(tmp_path / "data")
    out = tmp_path / "load.json"
    try:
        # Two workers, flush at once: both client paths and the merge of several logs.
        done = _tool("--server", url, "--server-pid", str(proc.pid), "--trainers", "2",
                     "--viewers", "4", "--procs", "2", "--warmup", "1", "--duration", "4",
                     "--interval", "0.05", "--flush-ms", "0", "--drain", "10",
                     "--out", str(out))
    finally:
        stop_server(proc)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    d, server = report["delivery"], report["server"]
    assert report["ok"] and not report["errors"]
    assert d["sent"] > 100 and d["acked"] == d["sent"] == d["stored"] == d["produced"]
    assert d["lost_store"] == d["lost_viewer"] == d["duplicated"] == d["unacked"] == 0
    for figure in ("ack_ms", "lag_ms"):
        assert d[figure]["n"] > 0
        assert 0 <= d[figure]["p50"] <= d[figure]["p99"] <= d[figure]["max"], d[figure]
    for key in ("cpu_mean", "cpu_max", "rss_start_mib", "rss_end_mib", "rss_slope_mib_per_min"):
        assert server[key] is not None, key
    assert report["summary"] in done.stdout and "n/a" not in report["summary"]
    assert "--trainers 2" in report["command"]


def test_refuses_a_server_that_is_not_loopback():
    done = _tool("--server", "http://192.0.2.1:8000", "--duration", "1", timeout=30)
    assert done.returncode == 2 and "loopback" in done.stderr
