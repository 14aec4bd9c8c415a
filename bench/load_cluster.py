"""bench/load.py against several server processes past one machine's defaults: a throwaway
PostgreSQL cluster (the store) and Redis (the broker), both started here as the tests start
them (tests/pg.py, tests/redis_server.py), N `andrea serve` processes on N ports over one data
dir, then bench/load.py with every server (trainers round-robin, each viewer on another process
than its run's trainer) and the rest of the command line passed through. Every process starts
with bench/load.py's raised per-client bounds (client_bounds_env: all clients here share one
address), sized from that command line. Everything is stopped at the end.

    python bench/load_cluster.py --processes 2 -- --trainers 100 --viewers 1000 --duration 60
    python bench/load_cluster.py --processes 2 --sqlite -- ...   # a shared SQLite file instead
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from andrea.cli.launch import start_server, stop_server  # noqa: E402
from bench.load import client_bounds_env, parse_args  # noqa: E402
from tests import pg  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--sqlite", action="store_true",
                    help="the data dir's SQLite file, shared, instead of PostgreSQL")
    ap.add_argument("load_args", nargs=argparse.REMAINDER,
                    help="after --: bench/load.py's arguments")
    args = ap.parse_args()
    load_args = [a for a in args.load_args if a != "--"]
    bounds = client_bounds_env(parse_args(load_args))   # (bad arguments: exit 2 before any start)
    with contextlib.ExitStack() as stack:
        env = {**bounds, "ANDREA_BROKER_URL": stack.enter_context(redis_server())}
        if not args.sqlite:
            cluster = stack.enter_context(pg.cluster())
            env["ANDREA_DATABASE_URL"] = stack.enter_context(cluster.database())
        data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="andrea-cluster-")))
        servers = []
        for _ in range(args.processes):
            proc, url = start_server(data / "data", env=env)
            stack.callback(stop_server, proc)
            servers.append((proc, url))
        cmd = [sys.executable, str(ROOT / "bench" / "load.py")]
        for proc, url in servers:
            cmd += ["--server", url, "--server-pid", str(proc.pid)]
        print(f"[cluster] {args.processes} processes, store "
              f"{'SQLite (shared)' if args.sqlite else 'PostgreSQL'}, broker Redis", flush=True)
        return subprocess.run(cmd + load_args).returncode


if __name__ == "__main__":
    raise SystemExit(main())
