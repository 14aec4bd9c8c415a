"""The test run that tests/api/test_interrupt.py starts and signals: one test that starts a server,
writes its pid where ANDREA_TEST_INTERRUPT_CHILD says, and serves until it is stopped. Not a
test_*.py file, so the suite itself never collects it."""

import os
import time
from pathlib import Path

from andrea.cli.launch import start_server, stop_server


def test_child_serves_until_stopped(tmp_path):
    proc, _ = start_server(tmp_path / "data")
    try:
        Path(os.environ["ANDREA_TEST_INTERRUPT_CHILD"]).write_text(str(proc.pid))
        time.sleep(600)
    finally:
        stop_server(proc)
