"""Who may change a run (server/web/auth.py, web/deps.py): every state change is authorized.
Each finding is reproduced against a real server (`andrea serve` on loopback with
ANDREA_ALLOWED_HOSTS=workshop.lan: a request under that name comes from another machine of the
workshop's LAN) and answered with a clear refusal that changes nothing: the run's row as the API
shows it, its token, its files on disk."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request
from websockets.sync.client import connect

from andrea.app import create_app
from andrea.cli.main import _with_admin_token
from andrea.config import Settings
from andrea.web.deps import NO_TOKEN, REVOKED, WRONG_TOKEN, request_is_local
from tests.api.test_checkpoints import headers, record, state
from tests.conftest import LOCAL
from tests.servers import serve
from tests.trainer_client import bearer, hello, new_run, ws_url

ADMIN = "operator-secret-token"
LAN = "workshop.lan"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, data dir, port) of one `andrea serve` for the whole module: a workshop's names,
    and the operator's own requests on this machine trusted (ANDREA_LOCAL_OWNER=1;
    tests/api/test_web_proxy.py has the default, which trusts none)."""
    with serve(tmp_path_factory.mktemp("workshop") / "data", allowed_hosts=LAN,
               admin_token=ADMIN, local_owner=1) as s:
        yield s.url, s.data, s.port


@pytest.fixture
def lan(server):
    """A participant's client: every request names the workshop's host, so none is local."""
    url, _, port = server
    with httpx.Client(base_url=url, headers={"host": f"{LAN}:{port}"}, timeout=60) as c:
        yield c


@pytest.fixture
def local(server):
    """The machine's own user (Host 127.0.0.1 on a loopback-only server)."""
    with httpx.Client(base_url=server[0], timeout=60) as c:
        yield c


@contextmanager
def training(url: str, local: httpx.Client):
    """A run training: records 1..4 and checkpoint 4 committed, its trainer socket open
    until the block ends."""
    run = new_run(local, steps=50)
    with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
        assert hello(ws, run["token"])["type"] == "welcome"
        ws.send(json.dumps({"type": "metrics", "records": [record(s) for s in range(1, 5)]}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "ack", "step": 4}
        ws.send(json.dumps({"type": "status", "status": "running"}))
        body = state(run)
        r = local.put(f"/api/runs/{run['id']}/checkpoints/4", content=body,
                      headers=headers(run["token"], body))
        assert r.status_code == 201, r.text
        yield run


def trained_run(url: str, local: httpx.Client) -> dict:
    """A run whose trainer dropped after checkpoint 4: resumable (the moment to strike)."""
    with training(url, local) as run:
        pass
    deadline = time.monotonic() + 15
    while not local.get(f"/api/runs/{run['id']}").json()["can_resume"]:
        assert time.monotonic() < deadline, "the trainer's drop was never noticed"
        time.sleep(0.05)
    return run


def shown(client: httpx.Client, run: dict) -> dict:
    """What the API says of the run (what an attack must leave as it was)."""
    info = client.get(f"/api/runs/{run['id']}").json()
    return {k: info[k] for k in ("name", "tags", "notes", "status", "last_step", "can_resume")}


def token_still_valid(url: str, run: dict) -> bool:
    """The real tab's token still opens the trainer socket (nothing revoked it)."""
    with connect(ws_url(url, f"/ws/runs/{run['id']}")) as ws:
        return hello(ws, run["token"])["type"] == "welcome"


def files(data, run: dict) -> list[str]:
    return sorted(p.name for p in (data / "runs" / run["id"]).rglob("*") if p.is_file())


def refused(r: httpx.Response, status: int, detail: str) -> None:
    assert (r.status_code, r.json()["detail"]) == (status, detail), r.text


# ---- the findings ----------------------------------------------------------------------------


def test_a_dropped_trainer_is_not_taken_over_without_its_token(server, lan, local):
    url, data, _ = server
    run = trained_run(url, local)
    before = shown(local, run)
    refused(lan.post(f"/api/runs/{run['id']}/resume"), 401, NO_TOKEN)
    assert lan.post(f"/api/runs/{run['id']}/resume").headers["www-authenticate"] == "Bearer"
    refused(lan.post(f"/api/runs/{run['id']}/resume", headers=bearer("guess")), 403, WRONG_TOKEN)
    refused(lan.post(f"/api/runs/{run['id']}/resume", headers={"authorization": run["token"]}),
            401, NO_TOKEN)                                  # not a Bearer: no token
    assert shown(local, run) == before and before["can_resume"]
    assert token_still_valid(url, run)
    # The run's own token takes it over, from another machine too; the old one is then revoked.
    r = lan.post(f"/api/runs/{run['id']}/resume", headers=bearer(run["token"]))
    assert r.status_code == 200 and r.json()["step"] == 4, r.text
    refused(lan.post(f"/api/runs/{run['id']}/resume", headers=bearer(run["token"])), 403, REVOKED)


def test_delete_rename_tags_and_notes_need_the_runs_token(server, lan, local):
    url, data, _ = server
    idle = trained_run(url, local)
    with training(url, local) as busy:      # PATCH was possible even while training
        for run in (idle, busy):
            before, on_disk = shown(local, run), files(data, run)
            path = f"/api/runs/{run['id']}"
            for body in ({"name": "pwned"}, {"tags": ["pwned"]}, {"notes": "pwned"}):
                refused(lan.patch(path, json=body), 401, NO_TOKEN)
                refused(lan.patch(path, json=body, headers=bearer("guess")), 403, WRONG_TOKEN)
            refused(lan.delete(path), 401, NO_TOKEN)
            other = idle if run is busy else busy      # another run's own token
            refused(lan.delete(path, headers=bearer(other["token"])), 403, WRONG_TOKEN)
            assert shown(local, run) == before and files(data, run) == on_disk
            assert "000000004.ckpt" in on_disk
        # With the run's own token: renamed.
        r = lan.patch(f"/api/runs/{busy['id']}", json={"name": "mine"},
                      headers=bearer(busy["token"]))
        assert r.status_code == 200 and r.json()["name"] == "mine", r.text


def test_a_branch_needs_the_parents_token(server, lan, local):
    url, data, _ = server
    parent = trained_run(url, local)
    attacker = new_run(local)   # their own, free token
    ids = {r["id"] for r in local.get("/api/runs").json()}
    dirs = sorted(p.name for p in (data / "runs").iterdir())
    branch = {"preset": "tiny", "steps": 50, "parent": {"run": parent["id"], "step": 4}}
    refused(lan.post("/api/runs", json=branch), 401, NO_TOKEN)
    refused(lan.post("/api/runs", json=branch, headers=bearer(attacker["token"])), 403,
            WRONG_TOKEN)
    assert {r["id"] for r in local.get("/api/runs").json()} == ids      # no new run row
    assert sorted(p.name for p in (data / "runs").iterdir()) == dirs    # no linked checkpoint
    # The parent's owner branches (and reads the checkpoint with the branch's token).
    r = lan.post("/api/runs", json=branch, headers=bearer(parent["token"]))
    assert r.status_code == 201, r.text
    got = lan.get(f"/api/runs/{r.json()['id']}/checkpoints/4", headers=bearer(r.json()["token"]))
    assert got.status_code == 200 and got.content == state(parent)
    # A plain new run needs no token.
    assert lan.post("/api/runs", json={"preset": "tiny"}).status_code == 201


def test_the_operator_token_works_for_each(server, lan, local):
    url, data, _ = server
    run = trained_run(url, local)
    admin = bearer(ADMIN)
    r = lan.patch(f"/api/runs/{run['id']}", json={"tags": ["checked"]}, headers=admin)
    assert r.status_code == 200 and r.json()["tags"] == ["checked"], r.text
    got = lan.get(f"/api/runs/{run['id']}/checkpoints/4", headers=admin)
    assert got.status_code == 200 and got.content == state(run)
    r = lan.post("/api/runs", headers=admin, json={
        "preset": "tiny", "steps": 50, "parent": {"run": run["id"], "step": 4}})
    assert r.status_code == 201, r.text
    r = lan.post(f"/api/runs/{run['id']}/resume", headers=admin)
    assert r.status_code == 200 and r.json()["step"] == 4, r.text
    assert lan.delete(f"/api/runs/{run['id']}", headers=admin).status_code == 204
    assert local.get(f"/api/runs/{run['id']}").status_code == 404
    assert not (data / "runs" / run["id"]).exists()


def test_without_a_token_an_unknown_run_answers_as_a_known_one(server, lan, local):
    run = new_run(local)
    asks = [("POST", "/resume", None), ("DELETE", "", None), ("PATCH", "", {"name": "x"}),
            ("GET", "/checkpoints/4", None)]
    for method, tail, body in asks:
        for token in ({}, bearer("guess")):
            known, unknown = (lan.request(method, f"/api/runs/{rid}{tail}", json=body,
                                          headers=token)
                              for rid in (run["id"], "nosuchrun00"))
            assert (known.status_code, known.text) == (unknown.status_code, unknown.text)
            assert known.status_code in (401, 403), (method, tail, known.text)
    branch = {"preset": "tiny", "parent": {"run": "nosuchrun00", "step": 1}}
    refused(lan.post("/api/runs", json=branch), 401, NO_TOKEN)


def test_another_sites_page_cannot_change_anything(server, local):
    url, _, port = server
    run = trained_run(url, local)
    before = shown(local, run)
    # A cross-site form or text/plain fetch needs no preflight: before, this resumed the run.
    evil = local.post(f"/api/runs/{run['id']}/resume", content="{}", headers={
        "origin": "http://evil.example", "content-type": "text/plain"})
    assert evil.status_code == 403 and "http://evil.example" in evil.json()["detail"], evil.text
    fetch_meta = local.delete(f"/api/runs/{run['id']}", headers={"sec-fetch-site": "cross-site"})
    assert fetch_meta.status_code == 403 and "cross-site" in fetch_meta.json()["detail"]
    other_port = local.patch(f"/api/runs/{run['id']}", json={"name": "x"},
                             headers={"origin": f"http://127.0.0.1:{port + 1}"})
    assert other_port.status_code == 403
    assert shown(local, run) == before and token_still_valid(url, run)
    # The server's own pages pass.
    same = local.patch(f"/api/runs/{run['id']}", json={"name": "renamed"}, headers={
        "origin": f"http://127.0.0.1:{port}", "sec-fetch-site": "same-origin"})
    assert same.status_code == 200 and same.json()["name"] == "renamed", same.text


@pytest.mark.parametrize("kind", ["weights", "checkpoint"])
def test_a_revoked_tokens_upload_in_flight_is_refused_at_its_end(server, local, kind):
    url, data, _ = server
    run = trained_run(url, local)
    if kind == "weights":
        body = bytes(4 * run["layout"]["total_numel"])
        path, sent = f"/api/runs/{run['id']}/weights", bearer(run["token"])
    else:
        body = state(run, 8)
        path, sent = f"/api/runs/{run['id']}/checkpoints/8", headers(run["token"], body)
    resumed, half, answer = threading.Event(), len(body) // 2, {}

    def gen():
        yield body[:half]
        resumed.wait(30)
        yield body[half:]

    def upload():
        answer["put"] = httpx.put(url + path, content=gen(), timeout=60,
                                  headers={**sent, "content-length": str(len(body))})
    t = threading.Thread(target=upload)
    t.start()
    deadline = time.monotonic() + 30    # the upload has begun: its part file is on disk
    while not any((data / "runs" / run["id"]).rglob("*.part*")):
        assert time.monotonic() < deadline, "the upload never began"
        time.sleep(0.02)
    r = local.post(f"/api/runs/{run['id']}/resume")
    resumed.set()
    t.join(60)
    assert r.status_code == 200, r.text
    refused(answer["put"], 403, REVOKED)
    assert files(data, run) == ["000000004.ckpt", "000000004.json"]    # nothing new stored
    assert local.get(f"/api/runs/{run['id']}").json()["has_weights"] is False


def test_the_local_user_keeps_todays_convenience(server, local, lan):
    url, data, _ = server
    run = trained_run(url, local)
    r = local.patch(f"/api/runs/{run['id']}", json={"name": "local rename"})
    assert r.status_code == 200 and r.json()["name"] == "local rename", r.text
    # Checkpoint reads need the token, here too.
    refused(local.get(f"/api/runs/{run['id']}/checkpoints/4"), 401, NO_TOKEN)
    assert local.delete(f"/api/runs/{run['id']}").status_code == 204
    assert not (data / "runs" / run["id"]).exists()


# ---- what counts as local --------------------------------------------------------------------


def _conn(host: str, client: str = "127.0.0.1", port: int = 8000, **headers: str) -> Request:
    """A request to a server listening on `port`, from `client`, with these headers."""
    raw = [(b"host", host.encode())] + [(k.replace("_", "-").encode(), v.encode())
                                        for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/", "query_string": b"",
                    "headers": raw, "client": (client, 50000), "server": ("127.0.0.1", port),
                    "scheme": "http"})


def test_local_means_this_machines_user_on_a_loopback_server(tmp_path):
    alone = Settings(data_dir=tmp_path)
    workshop = Settings(data_dir=tmp_path, allowed_hosts="workshop.lan")
    asked = Settings(data_dir=tmp_path, allowed_hosts="workshop.lan", local_owner=True)
    everywhere = Settings(data_dir=tmp_path, host="0.0.0.0", local_owner=True)
    for settings in (alone, asked):
        assert request_is_local(_conn("127.0.0.1:8000"), settings)
        assert request_is_local(_conn("[::1]:8000", client="::1"), settings)
        assert request_is_local(_conn("localhost:8000", client="127.0.0.5"), settings)
        assert request_is_local(_conn("localhost", port=80), settings)
        assert not request_is_local(_conn("workshop.lan:8000"), settings)
        # Not what this machine's browser sends: another port, another peer, a relayed request.
        assert not request_is_local(_conn("localhost"), settings)
        assert not request_is_local(_conn("127.0.0.1:8000", client="192.168.1.20"), settings)
        for header in ("x_forwarded_for", "forwarded", "x_real_ip", "via", "x_forwarded_host"):
            assert not request_is_local(_conn("localhost:8000", **{header: "10.1.2.3"}),
                                        settings), header
    # A workshop's names mean a proxy may be in front: nobody is local unless the operator asks.
    assert not request_is_local(_conn("127.0.0.1:8000"), workshop)
    assert not request_is_local(_conn("127.0.0.1:8000"), everywhere)
    assert not request_is_local(_conn("127.0.0.1:8000"),
                                Settings(data_dir=tmp_path, local_owner=False))
    # A server bound beyond loopback: even its own machine's requests show a token.
    with TestClient(create_app(Settings(data_dir=tmp_path, host="0.0.0.0", admin_token=ADMIN)),
                    base_url=LOCAL) as c:
        run = new_run(c)
        refused(c.delete(f"/api/runs/{run['id']}"), 401, NO_TOKEN)
        assert c.get(f"/api/runs/{run['id']}").status_code == 200
        assert c.delete(f"/api/runs/{run['id']}", headers=bearer(run["token"])).status_code == 204


def test_serve_makes_an_operator_token_when_other_machines_can_reach_it(tmp_path):
    settings, made = _with_admin_token(Settings(data_dir=tmp_path, host="0.0.0.0"))
    assert made and settings.admin_token == made and len(made) >= 32
    # Behind a proxy on this machine (a workshop's names): no one is local, so a token is made.
    assert _with_admin_token(Settings(data_dir=tmp_path, allowed_hosts=LAN))[1]
    asked = Settings(data_dir=tmp_path, allowed_hosts=LAN, local_owner=True)
    assert _with_admin_token(asked) == (asked, None)
    assert _with_admin_token(Settings(data_dir=tmp_path)) == (Settings(data_dir=tmp_path), None)
    given = Settings(data_dir=tmp_path, host="0.0.0.0", admin_token=ADMIN)
    assert _with_admin_token(given) == (given, None)


def test_andrea_train_takes_a_runs_token_and_prints_its_resume_link(monkeypatch):
    from andrea.cli.headless import resume_link
    from andrea.cli.main import build_parser

    args = build_parser().parse_args(["train", "--resume", "abc", "--token", "t0k"])
    assert (args.resume, args.token) == ("abc", "t0k")
    monkeypatch.setenv("ANDREA_TOKEN", "from-env")
    assert build_parser().parse_args(["train", "--resume", "abc"]).token == "from-env"
    assert resume_link("http://workshop.lan:8000", "abc", "t0k") == \
        "http://workshop.lan:8000/runs/abc#token=t0k"


def test_no_token_starts_with_a_dash(monkeypatch):
    """`andrea train --join RUN --token -Abc...` read the token as a flag: a room's e2e test
    failed so on a rehearsal, one token in 64."""
    import secrets

    from andrea import write_tokens as auth

    drawn = iter(["-AbcdEfgh", "--Qq", "AbcdEfgh"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(drawn))
    assert auth.new_token() == "AbcdEfgh"
