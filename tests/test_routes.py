from server import __version__


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "version": __version__}


def test_index_page(client):
    r = client.get("/")
    assert r.status_code == 200
    assert "text/html" in r.headers["content-type"]
    assert "Andrea" in r.text


def test_diagnostics_page_loads_its_module(client):
    r = client.get("/diagnostics")
    assert r.status_code == 200
    assert '/static/js/app/diagnostics.js' in r.text
    js = client.get("/static/js/app/diagnostics.js")
    assert js.status_code == 200
    assert "javascript" in js.headers["content-type"]


def test_shaders_served_as_text(client):
    r = client.get("/shaders/00_selftest.wgsl")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "@compute" in r.text


def test_missing_static_is_404(client):
    assert client.get("/static/js/nope.js").status_code == 404
    assert client.get("/shaders/nope.wgsl").status_code == 404
