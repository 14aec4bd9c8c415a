"""The Host and Origin allow-list (web/origin_check.py, config's host parsing), on a real
server."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.trainer_client import (
    new_run,
    ws_url,
)

# ---- Host and Origin -----------------------------------------------------------------------------


def test_host_and_origin_are_checked_against_the_allow_list(servers):
    server = servers(allowed_hosts="andrea.lan")
    url, port = server.url, server.port
    assert httpx.get(url + "/api/runs", headers={"host": f"evil.example:{port}"}).status_code \
        == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"andrea.lan:{port}"):
        assert httpx.get(url + "/api/runs", headers={"host": host}).status_code == 200, host
    run = new_run(url)
    path = f"/ws/runs/{run['id']}/watch"
    with pytest.raises(InvalidStatus):           # DNS rebinding: the page's own Host
        connect(ws_url(url, path), additional_headers={"host": f"evil.example:{port}"},
                origin=f"http://evil.example:{port}")
    with pytest.raises(InvalidStatus):           # Origin not in the list, even if Host is
        connect(ws_url(url, path), origin=f"http://evil.example:{port}")
    with pytest.raises(InvalidStatus):           # an allowed name on another port
        connect(ws_url(url, path), origin=f"http://localhost:{port + 1}")
    for origin in (f"http://localhost:{port}", f"http://andrea.lan:{port}"):
        with connect(ws_url(url, path), origin=origin) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "run"


def test_a_page_behind_a_proxy_on_a_default_port_is_its_own_origin(tmp_path):
    """Behind a proxy on 443 (or 80) the Host names no port: the page's port is its scheme's
    default (uvicorn takes https from a trusted proxy's X-Forwarded-Proto), not the server's
    own 8000; any other port or scheme is another site."""
    from andrea.config import Settings
    from andrea.web.origin_check import cross_site

    settings = Settings(data_dir=tmp_path, allowed_hosts=["workshop.local"])

    def refused(origin: str, host: str, scheme: str) -> bool:
        return cross_site({b"origin": origin.encode(), b"host": host.encode()}, settings,
                          scheme) is not None
    assert not refused("https://workshop.local", "workshop.local", "https")
    assert not refused("http://workshop.local", "workshop.local", "http")
    assert not refused("http://127.0.0.1:8000", "127.0.0.1:8000", "http")
    assert refused("https://workshop.local", "workshop.local", "http")      # 443 is not 80
    assert refused("http://workshop.local:8000", "workshop.local", "https")
    assert refused("https://elsewhere.example", "workshop.local", "https")
