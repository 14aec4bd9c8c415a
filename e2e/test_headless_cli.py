"""`andrea train --headless` completes a run and its exit code reflects success and failure; a
failure is one stderr line and one JSON object, and a run is never left `created`."""

import json
import subprocess
import sys

import pytest

from tests.small_model import cli_args


def andrea(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "andrea", "train", "--headless", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_completes_a_short_run(live_server):
    r = andrea(*cli_args(), "--optimizer", "adamw_8bit", "--steps", "8",
               "--batch-size", "2", "--server", live_server, "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["status"] == "finished" and result["steps"] == 8
    assert 0 < result["final_loss"] < 7


def test_cli_fails_on_a_bad_config(live_server):
    r = andrea("--preset", "tiny", "--steps", "0", "--server", live_server, "--json")
    assert r.returncode != 0
    assert "steps" in (r.stderr + r.stdout)


def test_cli_fails_when_the_page_cannot_train(live_server):
    # tiny at batch 1024 x context 2048 needs a 3 GiB gate|up buffer (batch x context x 2 x its
    # FFN width of 192; the logits go in chunks that bind): the page refuses it, the CLI exits 1.
    # (tiny's vocabulary: the server has its tokenizer already; 120m's would be trained first,
    # for nothing.)
    import httpx

    r = andrea("--preset", "tiny", "--steps", "2", "--batch-size", "1024", "--seq-len", "2048",
               "--server", live_server, "--json", "--timeout", "120")
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()
    result = json.loads(line)
    what = "the FFN's gate and up projections"
    assert not result["ok"] and what in result["error"]
    # The page throws it and shows it: said once, not "page error: X; Cannot train here: X".
    assert result["error"].count(what) == 1, result["error"]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("andrea train:")]
    assert errors == [f"andrea train: {result['error']}"] and "Traceback" not in r.stderr
    # Created but never trained: failed with the reason, not left `created`.
    run = httpx.get(f"{live_server}/api/runs/{result['run_id']}").json()
    assert result["status"] == run["status"] == "failed"
    assert run["message"] == result["error"]


# Chromium started without its WebGPU flags (the command's own are dropped): it runs, but offers
# no adapter (checked: --disable-gpu or --disable-features=WebGPU next to the flags do not take
# SwiftShader's adapter away; leaving the flags out does).
NO_WEBGPU = """#!/bin/sh
for a; do shift; case "$a" in
  --enable-unsafe-webgpu|--enable-unsafe-swiftshader|--use-webgpu-adapter=*) ;;
  *) set -- "$@" "$a" ;;
esac; done
exec "$ANDREA_REAL_CHROMIUM" "$@"
"""


def test_cli_fails_without_a_webgpu_adapter_before_creating_a_run(live_server, tmp_path):
    import os

    import httpx

    from andrea.cli.chromium import CHROMIUM

    wrapper = tmp_path / "chromium-without-webgpu"
    wrapper.write_text(NO_WEBGPU)
    wrapper.chmod(0o755)
    before = {r["id"] for r in httpx.get(f"{live_server}/api/runs").json()}
    r = andrea("--preset", "tiny", "--steps", "2", "--server", live_server, "--json",
               timeout=120, env={**os.environ, "ANDREA_CHROMIUM": str(wrapper),
                                 "ANDREA_REAL_CHROMIUM": CHROMIUM})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    (err,) = r.stderr.strip().splitlines()
    (line,) = r.stdout.strip().splitlines()
    result = json.loads(line)
    assert not result["ok"] and err == f"andrea train: {result['error']}"
    assert result["error"].startswith("no WebGPU adapter: the browser at ANDREA_CHROMIUM=")
    assert result["run_id"] is None
    assert {r["id"] for r in httpx.get(f"{live_server}/api/runs").json()} == before


# A server whose static/ lacks one engine module, as a broken install would.
BROKEN_SERVER = """
import shutil, sys
from pathlib import Path
import uvicorn
import andrea.assets as assets
from andrea.app import create_app
from andrea.config import Settings
static = Path(sys.argv[2]) / "static"
shutil.copytree(assets.asset_dir("static"), static)
(static / "js" / "engine" / "trainer.js").unlink()
real = assets.asset_dir
assets.asset_dir = lambda name: static if name == "static" else real(name)
import andrea.app
andrea.app.asset_dir = assets.asset_dir
uvicorn.run(create_app(Settings(data_dir=Path(sys.argv[2]) / "data")), host="127.0.0.1",
            port=int(sys.argv[1]), log_level="warning")
"""


def test_cli_fails_fast_when_a_module_is_missing(tmp_path):
    import time
    import urllib.request

    from andrea.cli.launch import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", BROKEN_SERVER, str(port), str(tmp_path)])
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        # 30 s is the bound for this case; without the check the CLI waited an hour.
        r = andrea("--preset", "tiny", "--steps", "4", "--server", f"http://127.0.0.1:{port}",
                   "--json", timeout=60)
    finally:
        server.terminate()
        server.wait()
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()
    result = json.loads(line)
    assert not result["ok"] and "trainer.js: HTTP 404" in result["error"], result


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])    # Ctrl-C; kill, timeout, a service
def test_ctrl_c_stops_the_run_and_exits_130(live_server, sig):
    import signal
    import time

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "andrea", "train", "--preset", "tiny",
                             "--steps", "100000", "--batch-size", "2", "--server", live_server,
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = None
        for _ in range(600):   # until the run has committed a step
            time.sleep(0.5)
            runs = httpx.get(f"{live_server}/api/runs").json()
            live = [r for r in runs if r["config"]["steps"] == 100000 and r["status"] == "running"
                    and (r.get("last_step") or 0) >= 1]
            if live:
                run_id = live[0]["id"]
                break
        assert run_id, "the run never started"
        proc.send_signal(getattr(signal, sig))
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"andrea train did not exit within 120 s of {sig}; its stderr "
                                 f"ends:\n{err[-4000:]}") from None
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    (line,) = out.strip().splitlines()
    result = json.loads(line)
    assert result["run_id"] == run_id and result["status"] == "stopped", result
    assert httpx.get(f"{live_server}/api/runs/{run_id}").json()["status"] == "stopped"


def test_a_run_past_its_timeout_is_stopped_with_its_records(live_server):
    """--timeout: the page stops the run as on Ctrl-C (it was left running, nobody training it)."""
    import httpx

    r = andrea(*cli_args(), "--steps", "100000", "--batch-size", "2", "--timeout", "20",
               "--server", live_server, "--json")
    assert r.returncode == 1, r.stderr + r.stdout
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["status"] == "stopped", result
    assert result["error"] == "no result within 20 s: the run was stopped"
    run = httpx.get(f"{live_server}/api/runs/{result['run_id']}").json()
    assert run["status"] == "stopped" and "--timeout" in run["message"]
    assert run["last_step"] == result["steps"]
