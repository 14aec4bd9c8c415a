"""Owner's rights behind the README's reverse proxy (server/web/deps.py request_is_local):
`andrea serve` on 127.0.0.1 with ANDREA_ALLOWED_HOSTS=workshop.local, and a real nginx in front
of it configured as the README says (Host passed through, X-Forwarded-For added, websockets
upgraded). A participant who names `localhost` (with or without the server's port) gets no
owner's rights through it: resume, rename, branch and delete all need the run's token, and
nothing changes. The operator's direct requests on the machine are trusted only when
ANDREA_LOCAL_OWNER=1 asks for it, and even then never through the proxy."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from andrea.cli.launch import free_port
from andrea.web.deps import NO_TOKEN
from tests.api.test_web_auth import ADMIN, files, refused, shown, token_still_valid, trained_run
from tests.servers import serve
from tests.trainer_client import bearer, hello

NAME = "workshop.local"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

# The README's recipe ("A workshop, and past one machine"), with the ports filled in.
RECIPE = """
    server {{
        listen 127.0.0.1:{listen};
        server_name {name};
        client_max_body_size 0;           # checkpoint uploads: Andrea bounds them itself
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 1h;
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
"""


def nginx_conf(prefix: Path, servers: str) -> Path:
    """An nginx.conf around `servers` (server blocks) whose files all live under `prefix`."""
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{servers}
}}
""")
    return conf


def start_nginx(prefix: Path, servers: str, port: int) -> subprocess.Popen:
    """nginx in the foreground with `servers`, once `port` answers."""
    proc = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(nginx_conf(prefix, servers))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"nginx did not start: {proc.stderr.read().decode()}")
            time.sleep(0.05)


def _nginx(prefix: Path, upstream: int) -> tuple[subprocess.Popen, int]:
    """nginx with RECIPE on a free port; (process, its port)."""
    listen = free_port()
    servers = "map $http_upgrade $connection_upgrade { default upgrade; '' close; }\n" + \
        RECIPE.format(listen=listen, name=NAME, upstream=upstream)
    return start_nginx(prefix, servers, listen), listen


@pytest.fixture(scope="module", params=["default", "local owner asked"])
def workshop(request, tmp_path_factory):
    """(server url, proxy url, data dir, server port, local_owner asked) for the README's setup:
    the server on loopback, nginx in front; with and without ANDREA_LOCAL_OWNER=1."""
    if not Path(NGINX).exists():
        pytest.skip("nginx is not installed (bash scripts/test installs Debian's)")
    asked = request.param != "default"
    root = tmp_path_factory.mktemp("proxy")
    with serve(root / "data", allowed_hosts=NAME, admin_token=ADMIN,
               **({"local_owner": 1} if asked else {})) as s:
        nginx, listen = _nginx(root / "nginx", s.port)
        try:
            yield s.url, f"http://127.0.0.1:{listen}", s.data, s.port, asked
        finally:
            nginx.terminate()
            nginx.wait(10)


def _client(url: str, host: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"host": host}, timeout=60)


def test_no_owners_rights_through_the_proxy_whatever_the_host(workshop):
    url, proxy, data, port, asked = workshop
    with httpx.Client(base_url=url, timeout=60) as local:
        run = trained_run(url, _token_client(local, asked))
        before, on_disk = shown(local, run), files(data, run)
        for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}",
                     f"{NAME}"):
            with _client(proxy, host) as participant:
                rid = run["id"]
                refused(participant.post(f"/api/runs/{rid}/resume"), 401, NO_TOKEN)
                refused(participant.patch(f"/api/runs/{rid}", json={"name": "mine"}), 401,
                        NO_TOKEN)
                refused(participant.delete(f"/api/runs/{rid}"), 401, NO_TOKEN)
                refused(participant.post("/api/runs", json={
                    "preset": "tiny", "steps": 50, "parent": {"run": rid, "step": 4}}), 401,
                    NO_TOKEN)
                refused(participant.get(f"/api/runs/{rid}/checkpoints/4"), 401, NO_TOKEN)
        assert shown(local, run) == before and files(data, run) == on_disk
        assert token_still_valid(url, run)
        # The run's own token works through the proxy, websockets included.
        with _client(proxy, NAME) as owner:
            r = owner.patch(f"/api/runs/{run['id']}", json={"name": "renamed by its owner"},
                            headers=bearer(run["token"]))
            assert r.status_code == 200, r.text
        listen = int(proxy.rsplit(":", 1)[1])
        # (the participant's name for the proxy, on a socket to it: no DNS for workshop.local)
        with connect(f"ws://{NAME}:{listen}/ws/runs/{run['id']}",
                     sock=socket.create_connection(("127.0.0.1", listen))) as ws:
            assert hello(ws, run["token"])["type"] == "welcome"


def _token_client(local: httpx.Client, asked: bool) -> httpx.Client:
    """The operator's own client: its direct requests are trusted only when asked; else it
    shows the operator's token."""
    if not asked:
        local.headers.update(bearer(ADMIN))
    return local


def test_the_operators_direct_requests_are_trusted_only_when_asked(workshop):
    url, proxy, _, port, asked = workshop
    with httpx.Client(base_url=url, timeout=60) as local:
        run = local.post("/api/runs", json={"preset": "tiny"}).json()
        r = local.patch(f"/api/runs/{run['id']}", json={"name": "operator's"})
        if asked:
            assert r.status_code == 200, r.text
        else:
            refused(r, 401, NO_TOKEN)
        # A client on this machine claiming to be relayed for someone is not the owner either.
        r = local.patch(f"/api/runs/{run['id']}", json={"name": "x"},
                        headers={"x-forwarded-for": "127.0.0.1"})
        refused(r, 401, NO_TOKEN)
        assert local.delete(f"/api/runs/{run['id']}", headers=bearer(ADMIN)).status_code == 204
