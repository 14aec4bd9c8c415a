"""The engine's unit tests under Node (`node --test`, tests/js/): one pytest test per file, so
they run beside the rest of the suite on a worker of its own, and a failure names its file and
shows Node's report."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parents[1] / "js"


@pytest.mark.parametrize("name", sorted(p.name for p in JS.glob("*.test.mjs")))
def test_engine_unit_tests_pass_under_node(name):
    assert shutil.which("node"), "Node.js is not installed (apt-get install nodejs)"
    r = subprocess.run(["node", "--test", "--test-reporter=spec", str(JS / name)],
                       cwd=JS.parent.parent, capture_output=True, text=True, timeout=300,
                       # tests/js/server.mjs asks the server's Python: the one running pytest.
                       env={**os.environ, "ANDREA_VENV": sys.prefix})
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
