"""A throwaway PostgreSQL cluster started by the test run itself: initdb into a temporary
folder, pg_ctl on a free port of 127.0.0.1 (fsync off: nothing here needs to survive), one
database per test (`Cluster.database`), stopped and deleted at the end of the session. As root
the cluster runs as the `postgres` user (PostgreSQL refuses root). Without the binaries the tests
that need it are skipped, saying what to install."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from andrea.cli.launch import free_port

INSTALL = "apt-get install postgresql"


def find_bin(name: str) -> str | None:
    """`initdb` or `pg_ctl`: on PATH, else Debian's /usr/lib/postgresql/<newest>/bin."""
    if found := shutil.which(name):
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return versions[-1] if versions else None


class Cluster:
    def __init__(self, initdb: str, pg_ctl: str):
        self.pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="andrea-pg-"))
        self.data, self.sock = self.root / "data", self.root / "sock"
        self.sock.mkdir()
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:       # PostgreSQL will not run as root
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.root)
                pytest.skip("running as root and there is no `postgres` user to run "
                            f"PostgreSQL as ({INSTALL} creates it)")
            self.user = "postgres"
            for p in (self.root, self.sock):
                os.chown(p, entry.pw_uid, entry.pw_gid)
        self._run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-locale", "-E", "UTF8", "--no-sync")

    def _run(self, *cmd: str) -> None:
        if self.user:
            cmd = ("runuser", "-u", self.user, "--", *cmd)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")

    def start(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-t", "60", "-o", f"-p {self.port} -k {self.sock} "
                  "-c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off "
                  "-c synchronous_commit=off -c max_connections=200", "start")

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new, empty database's URL (postgresql://...), dropped afterwards."""
        name = "t_" + uuid.uuid4().hex[:16]
        self._admin(f"CREATE DATABASE {name}")
        try:
            yield self.url(name)
        finally:
            self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def cluster() -> Iterator[Cluster]:
    """A running throwaway cluster; pytest.skip when PostgreSQL is not installed."""
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip(f"PostgreSQL is not installed (no initdb/pg_ctl on PATH or in "
                    f"/usr/lib/postgresql/*/bin): {INSTALL}")
    c = Cluster(initdb, pg_ctl)
    try:
        c.start()
        yield c
    finally:
        try:
            c.stop()
        except RuntimeError:
            pass            # already stopped (a test stopped it and failed before restarting)
        c.remove()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """The session's cluster (a test may stop and start it: the outage tests)."""
    with cluster() as c:
        yield c
