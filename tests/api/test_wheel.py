"""The built wheel is self-contained: installed into a fresh virtual environment, `andrea serve`
started from an unrelated folder serves a page, a shader and the chart library, and `andrea
train` trains (a plain install is enough: no extra, no browser download). Building it prints no
packaging warning, and it holds exactly the package's modules and the files the app serves."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200, url
        return r.read().decode()


# The package's source folders (pyproject.toml's package-dir): the wheel is every file git sees in
# them (tracked, or new and not ignored), under andrea/.
PACKAGE_DIRS = {"server": "andrea", "static": "andrea/static", "shaders": "andrea/shaders",
                "templates": "andrea/templates"}
# pip's own note about this machine's index configuration (pip.conf), not about the package.
PIP_INDEX_NOTE = re.compile(r"WARNING: Location '[^']*' is ignored: "
                            r"it is neither a file nor a directory\.")


def _git_files() -> list[str]:
    """The checkout's files that git sees: tracked or untracked-not-ignored, present."""
    r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted({f for f in r.stdout.split("\0") if f and (ROOT / f).is_file()})


def _expected_wheel_files(sources: list[str]) -> set[str]:
    """Every Python module under server/ (and server/data's README.md), and every file under
    static/, shaders/ and templates/, at its place in the installed package."""
    expected = set()
    for f in sources:
        top, _, rest = f.partition("/")
        if top in PACKAGE_DIRS:
            expected.add(f"{PACKAGE_DIRS[top]}/{rest}")
    return expected


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory) -> tuple[Path, str, list[str]]:
    """The wheel, built by pip from a copy of the files git sees (setuptools builds in the tree,
    and a checkout's build/ keeps files deleted since, which would go into the wheel; nor does
    the test then write build/ or andrea.egg-info into the checkout), pip's verbose output (the
    build backend's own lines, which pip hides without -v), and the files copied (the expected
    set comes from this snapshot: the checkout may change while the test runs)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    sources = []
    for f in _git_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(ROOT / f, src / f)
        except FileNotFoundError:   # deleted since git listed it
            continue
        sources.append(f)
    # Without PYTHONDONTWRITEBYTECODE: under it setuptools says "warning: ... byte-compiling is
    # disabled, skipping." (about the environment, not the package).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp),
                        str(src)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (wheel,) = tmp.glob("andrea-*.whl")
    return wheel, r.stdout + r.stderr, sources


@pytest.fixture(scope="module")
def wheel_venv(wheel_build) -> Path:
    wheel = wheel_build[0]
    venv = wheel.parent / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Byte-compiled on every core after the install, as scripts/venv.sh does (pip compiles one
    # file at a time).
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        "--no-compile", str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-qq", "-j", "0",
                    str(next((venv / "lib").glob("python3*/site-packages")))])
    return venv


def test_wheel_build_prints_no_packaging_warning(wheel_build):
    """The build (what `pip install .` runs too) warns of nothing: setuptools took the data
    folders with importable names (shaders/lib, static/js/app, ...) for packages missing from
    the configuration ("Package would be ignored") until include-package-data went off."""
    output = wheel_build[1]
    warnings = [line for line in output.splitlines()
                if re.search(r"warning|would be ignored", line, re.IGNORECASE)
                and not PIP_INDEX_NOTE.fullmatch(line.strip())]
    assert warnings == [], "\n".join(warnings)


def test_wheel_holds_exactly_the_modules_and_the_app_files(wheel_build):
    """Nothing less (a module, a page, a shader, a vendored file), nothing more (tests, bench,
    docs, caches): the wheel's files are the source tree's, derived from git, not listed here."""
    import zipfile

    wheel, _, sources = wheel_build
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info/"
    files = {n for n in names if not n.startswith(dist_info)}
    expected = _expected_wheel_files(sources)
    # A floor under the derivation itself: these must be among the expected files.
    for must in ("andrea/app.py", "andrea/cli/main.py", "andrea/templates/run.html",
                 "andrea/shaders/03_linear.wgsl", "andrea/shaders/lib/common.wgsl",
                 "andrea/static/css/app.css", "andrea/static/js/engine/trainer.js",
                 "andrea/static/vendor/uplot/uPlot.esm.js", "andrea/static/vendor/uplot/LICENSE"):
        assert must in expected, must
    assert sorted(expected - files) == [], "missing from the wheel"
    assert sorted(files - expected) == [], "in the wheel but not the app's"
    assert len(names) == len(set(names))   # no file twice


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
