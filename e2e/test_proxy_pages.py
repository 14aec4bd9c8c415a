"""The README's HTTPS recipe, verbatim, on the default ports: nginx with the README's server
block (a throwaway certificate from trustme and the server's port put in) listening on 443 and
80, `andrea serve` on loopback behind it with ANDREA_ALLOWED_HOSTS=workshop.local, and a real
Chromium that resolves workshop.local to this machine. Through the proxy, on each port, the
app's own pages create a run, train it, rename it, watch it and compare it (the Host carries
no port there: the page's port is its scheme's default); a page of another site is still
refused, through the proxy as directly."""

from __future__ import annotations

import http.server
import re
import shutil
import socket
import threading
from pathlib import Path

import httpx
import pytest

from andrea.cli.chromium import CHROMIUM
from andrea.cli.launch import free_port, start_server, stop_server
from tests.api.test_web_proxy import start_nginx
from tests.browser import PAGE_WAIT_MS, browser_args

NAME = "workshop.local"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
README = Path(__file__).resolve().parents[1] / "README.md"
TIMEOUT = 120_000


def readme_recipe() -> str:
    """The README's nginx block, as printed there."""
    blocks = re.findall(r"```nginx\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the README has one nginx recipe"
    return blocks[0]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """(the server's own url, its data dir) with the README's nginx in front on 443 and 80."""
    if not Path(NGINX).exists():
        pytest.skip("nginx is not installed (bash scripts/test installs Debian's)")
    if not (_bindable(443) and _bindable(80)):
        pytest.skip("ports 443 and 80 are taken or need root (bash scripts/test runs as root)")
    import trustme

    root = tmp_path_factory.mktemp("proxy443")
    ca = trustme.CA()
    cert = ca.issue_cert(NAME)
    cert.cert_chain_pems[0].write_to_path(root / "cert.pem")
    cert.private_key_pem.write_to_path(root / "key.pem")
    proc, url = start_server(root / "data", env={"ANDREA_ALLOWED_HOSTS": NAME,
                                                 "ANDREA_ADMIN_TOKEN": "operator-" + "x" * 24})
    port = int(url.rsplit(":", 1)[1])
    recipe = (readme_recipe()
              .replace("/etc/ssl/workshop.local.pem", str(root / "cert.pem"))
              .replace("/etc/ssl/workshop.local.key", str(root / "key.pem"))
              .replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}"))
    assert recipe.count(str(root)) == 2 and f":{port};" in recipe
    # Ready when a port of its own answers (443 may be another suite's nginx beside this one,
    # which answers too); nginx binds every listen at once, so a taken 443 or 80 stops it.
    probe = free_port()
    try:
        nginx = start_nginx(root, recipe + f"server {{ listen 127.0.0.1:{probe}; return 204; }}\n",
                            probe)
    except RuntimeError as e:
        stop_server(proc)
        if "in use" in str(e):
            # The recipe listens on 443 and 80 as printed; another program holds them here
            # (a second suite's nginx beside this one: that suite runs this test).
            pytest.skip(f"another program listens on 443 or 80, which the README's recipe "
                        f"binds: {e}")
        raise
    except BaseException:
        stop_server(proc)
        raise
    try:
        yield url, root / "data"
    finally:
        nginx.terminate()
        nginx.wait(10)
        stop_server(proc)


@pytest.fixture(scope="module")
def participant(playwright, proxied):
    """A participant's Chromium: workshop.local is this machine; the throwaway certificate is
    accepted, and the plain-HTTP page on 80 counts as secure (as a LAN's certificate-less
    setup would need a flag for, for WebGPU)."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
        *browser_args(), f"--host-resolver-rules=MAP {NAME} 127.0.0.1",
        f"--unsafely-treat-insecure-origin-as-secure=http://{NAME}"])
    try:
        yield browser
    finally:
        browser.close()


def create_and_train(page, base: str) -> str:
    page.goto(base + "/")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    page.select_option("#preset", "tiny")
    for name, value in {"steps": 6, "batch_size": 2, "eval_every": 3,
                        "sample_every": 0}.items():
        page.fill(f"input[name={name}]", str(value))
    page.wait_for_function("!document.getElementById('start').disabled", timeout=120_000)
    page.click("#start")
    page.wait_for_url("**/runs/*", timeout=TIMEOUT)
    run_id = page.url.rsplit("/", 1)[1]
    try:
        page.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    except Exception:
        raise AssertionError(page.inner_text("body")) from None
    assert page.evaluate("document.body.dataset.done") == "finished", page.inner_text("body")
    return run_id


@pytest.mark.parametrize("base", [f"https://{NAME}", f"http://{NAME}"], ids=["443", "80"])
def test_the_apps_pages_work_through_the_readme_proxy(proxied, participant, base):
    url, _ = proxied
    context = participant.new_context(ignore_https_errors=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        run_id = create_and_train(page, base)
        run = httpx.get(f"{url}/api/runs/{run_id}").json()
        assert run["status"] == "finished" and run["last_step"] == 6
        # Watched: a second tab (a viewer's websocket through the proxy) draws its records.
        viewer = context.new_page()
        viewer.goto(f"{base}/runs/{run_id}")
        viewer.wait_for_function("document.body.dataset.socket === 'connected'",
                                 timeout=PAGE_WAIT_MS)
        viewer.wait_for_function("document.getElementById('charts').dataset.steps === '6'",
                                 timeout=PAGE_WAIT_MS)
        # Renamed from the runs list, with the token the creating tab holds.
        page.goto(f"{base}/runs")
        page.wait_for_function("document.body.dataset.ready === '1'")
        row = f"tr[data-run-id='{run_id}']"
        page.click(f"{row} button.rename")
        page.locator(f"{row} td.name input").fill(f"through {base}")
        page.locator(f"{row} td.name input").press("Enter")
        page.wait_for_function(f"document.querySelector(\"{row} td.name a\")?.textContent"
                               f" === 'through {base}'")
        assert httpx.get(f"{url}/api/runs/{run_id}").json()["name"] == f"through {base}"
        # Compared.
        page.goto(f"{base}/compare?ids={run_id}")
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
        assert page.get_attribute("[data-chart='loss']", "data-points") == "6"
        assert not errors, errors
    finally:
        context.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_another_sites_page_is_refused_through_the_proxy(proxied, participant, tmp_path):
    """A page of another origin (here http://127.0.0.1 on another port) posts a run with a
    form-like request (no preflight) and opens a trainer socket through the proxy: both
    refused, nothing created."""
    url, _ = proxied
    (tmp_path / "index.html").write_text("<!doctype html><title>elsewhere</title>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = participant.new_context(ignore_https_errors=True)
    try:
        before = httpx.get(f"{url}/api/runs").json()
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        for base in (f"https://{NAME}", f"http://{NAME}"):
            page.evaluate("""async (u) => { await fetch(u + '/api/runs', {method: 'POST',
                mode: 'no-cors', headers: {'content-type': 'text/plain'},
                body: JSON.stringify({preset: 'tiny'})}).catch(() => {}); }""", base)
            code = page.evaluate("""(u) => new Promise((done) => {
                const ws = new WebSocket(u.replace('http', 'ws') + '/ws/runs/x');
                ws.onclose = (e) => done(e.code); })""", base)
            assert code != 1000, code
        assert httpx.get(f"{url}/api/runs").json() == before
    finally:
        context.close()
        server.shutdown()
