"""`andrea train --headless` completes a run and its exit code reflects success and failure."""

import json
import subprocess
import sys


def andrea(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "andrea", "train", "--headless", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_cli_completes_a_short_run(live_server):
    r = andrea("--preset", "tiny", "--optimizer", "adamw_8bit", "--steps", "8",
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
    # 120m at batch 64 needs a 2 GiB logits buffer: the page refuses it, the CLI exits 1.
    r = andrea("--preset", "120m", "--steps", "2", "--batch-size", "64", "--server", live_server,
               "--json", "--timeout", "120")
    assert r.returncode == 1, r.stdout + r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert not result["ok"] and "logits" in result["error"]
