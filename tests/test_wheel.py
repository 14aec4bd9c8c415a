"""The built wheel is self-contained: installed into a fresh virtual environment, `andrea serve`
started from an unrelated folder serves a page, a shader and the chart library, and `andrea
train` trains (a plain install is enough: no extra, no browser download)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200, url
        return r.read().decode()


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp),
                    str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp.glob("andrea-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Byte-compiled on every core after the install, as scripts/venv.sh does (pip compiles one
    # file at a time).
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        "--no-compile", str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-qq", "-j", "0",
                    str(next((venv / "lib").glob("python3*/site-packages")))])
    return venv


def test_wheel_carries_the_app_files(wheel_venv):
    import zipfile

    (wheel,) = wheel_venv.parent.glob("andrea-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("andrea/app.py", "andrea/templates/run.html", "andrea/shaders/03_linear.wgsl",
                 "andrea/static/js/engine/trainer.js", "andrea/static/vendor/uplot/uPlot.esm.js",
                 "andrea/static/vendor/uplot/LICENSE"):
        assert must in names, must
    assert not any(n.startswith(("server/", "tests/")) for n in names)


def test_installed_wheel_serves_from_any_folder(wheel_venv, tmp_path):
    from andrea.cli.launch import free_port

    port = free_port()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.Popen([str(wheel_venv / "bin" / "andrea"), "serve", "--port", str(port),
                             "--data-dir", str(tmp_path / "data"), "--no-warm-data"],
                            cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                _get(url + "/healthz")
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(proc.stdout.read())
                time.sleep(0.2)
        html = _get(url + "/")
        shaders = re.search(r'data-shaders="([^"]+)"', html).group(1)
        assert "@compute" in _get(url + shaders + "03_linear.wgsl")
        uplot = re.search(r'"uplot": "([^"]+)"', html).group(1)
        assert "uPlot" in _get(url + uplot)
        static = re.search(r'src="([^"]+/)js/app/new_run\.js"', html).group(1)
        assert "Trainer.create(" in _get(url + static + "js/app/training.js")
        assert "createContext" in _get(url + static + "js/engine/context.js")
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    # Nothing was written where the server was started.
    assert list(elsewhere.iterdir()) == []


@pytest.mark.browser   # andrea train starts Chromium
def test_installed_wheel_trains_from_the_cli(wheel_venv, tmp_path):
    """`pip install andrea` then `andrea train`: Playwright comes with the package and drives
    the system's Chromium (or ANDREA_CHROMIUM); one JSON object on stdout."""
    r = subprocess.run([str(wheel_venv / "bin" / "andrea"), "train", "--preset", "tiny",
                        "--steps", "2", "--batch-size", "2", "--data-dir", str(tmp_path),
                        "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["ok"] and result["status"] == "finished" and result["steps"] == 2, result
