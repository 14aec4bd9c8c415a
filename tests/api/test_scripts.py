"""The README's set-up scripts: they make and re-use the checkout's own virtual environment and
never install into the system's interpreter (Debian's refuses: PEP 668)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_python_without_venv_gets_a_one_line_hint(tmp_path):
    """A python3 that cannot make a virtual environment (Debian without python3-venv): one line
    naming the package, exit 1, no half-made environment, and no other use of that python3."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "python3").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        'echo "The virtual environment was not created successfully because ensurepip is not '
        'available." >&2\nexit 1\n')
    (fake / "python3").chmod(0o755)
    venv = tmp_path / "venv"
    r = subprocess.run(["bash", "scripts/serve", "--help"], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "PATH": f"{fake}:/usr/bin:/bin",
                                       "ANDREA_VENV": str(venv)})
    assert r.returncode == 1
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1 and "apt-get install python3-venv" in errors[0], r.stderr
    assert "ensurepip is not available" in errors[0]
    assert not venv.exists()
    assert calls.read_text().split() == ["-m", "venv", str(venv)]   # no pip, no install


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests run outside a venv")
def test_serve_reuses_the_environment_and_serves(tmp_path):
    """In the environment scripts/test made (its stamp matches): no install, and the app is
    served on the port given."""
    from andrea.cli.launch import free_port

    port = free_port()
    proc = subprocess.Popen(
        ["bash", "scripts/serve", "--port", str(port), "--data-dir", str(tmp_path),
         "--no-warm-data"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "ANDREA_VENV": sys.prefix})
    try:
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        else:
            pytest.fail("scripts/serve did not answer")
    finally:
        proc.terminate()
        out = proc.communicate(timeout=15)[0]
    assert "installing" not in out and "making the virtual environment" not in out, out
    assert f"open http://127.0.0.1:{port}/" in out


def test_markers_select_the_tests_by_what_they_need(tmp_path):
    """conftest.py's markers: `-m "not browser"` leaves out the e2e and GPU tests and keeps the
    server's; `-m db` takes the PostgreSQL parameter of a store test and not its SQLite one.
    One collection (a plugin prints each test's markers as pytest's -m reads them), not one per
    selection: each costs ~20 s of imports."""
    (tmp_path / "marker_dump.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    for item in session.items:\n"
        "        print('MARKS', item.nodeid, *sorted({m.name for m in item.iter_markers()}))\n")
    paths = ("e2e/test_diagnostics.py", "tests/unit/gpu/test_kernels.py",
             "tests/unit/test_model_layout.py", "tests/service/test_store.py")
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                        "no:cacheprovider", "-p", "marker_dump", *paths], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    marks = {line.split()[1]: set(line.split()[2:]) for line in r.stdout.splitlines()
             if line.startswith("MARKS ")}

    def collected(want):
        return {t for t, m in marks.items() if want(m)}

    light = collected(lambda m: "browser" not in m)
    assert light and all(t.startswith(("tests/unit/test_model_layout", "tests/service/test_store"))
                         for t in light)
    gpu = collected(lambda m: "gpu" in m)
    assert gpu and all(t.startswith("tests/unit/gpu/") for t in gpu)
    db = collected(lambda m: "db" in m)
    assert db and all("postgresql" in t for t in db)
    assert any("sqlite" in t for t in light - db)
