import json
import re

from andrea import __version__


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "version": __version__}


def test_index_page(client):
    r = client.get("/")
    assert r.status_code == 200
    assert "text/html" in r.headers["content-type"]
    assert "Andrea" in r.text


def _asset_urls(html: str) -> tuple[str, str]:
    """The page's versioned static and shader bases (templates/base.html)."""
    static = re.search(r'src="(/static/v-[0-9a-f]{12}/)js/app/', html).group(1)
    shaders = re.search(r'data-shaders="(/shaders/v-[0-9a-f]{12}/)"', html).group(1)
    return static, shaders


def test_pages_load_versioned_modules_cached_for_good(client):
    r = client.get("/diagnostics")
    assert r.status_code == 200
    static, shaders = _asset_urls(r.text)
    js = client.get(static + "js/app/diagnostics.js")
    assert js.status_code == 200
    assert "javascript" in js.headers["content-type"]
    assert "immutable" in js.headers["cache-control"]
    wgsl = client.get(shaders + "00_selftest.wgsl")
    assert wgsl.status_code == 200 and "@compute" in wgsl.text
    assert "immutable" in wgsl.headers["cache-control"]
    # Plain paths still answer, revalidated on every use so that they are never stale.
    plain = client.get("/static/js/app/diagnostics.js")
    assert plain.status_code == 200 and plain.headers["cache-control"] == "no-cache"
    assert plain.text == js.text


def test_chart_library_is_vendored_and_mapped(client):
    html = client.get("/runs/abc").text
    static, _ = _asset_urls(html)
    imports = json.loads(re.search(r'<script type="importmap">(.*?)</script>', html).group(1))
    assert imports["imports"]["uplot"] == static + "vendor/uplot/uPlot.esm.js"
    lib = client.get(imports["imports"]["uplot"])
    assert lib.status_code == 200 and "export" in lib.text
    assert client.get(static + "vendor/uplot/uPlot.min.css").status_code == 200


def test_text_assets_are_gzipped(client):
    r = client.get("/static/vendor/uplot/uPlot.esm.js", headers={"accept-encoding": "gzip"})
    assert r.headers.get("content-encoding") == "gzip"


def test_docs_need_no_cdn_and_the_api_is_described(client):
    assert client.get("/docs").status_code == 404
    spec = client.get("/openapi.json").json()
    run = spec["paths"]["/api/runs/{run_id}"]["get"]["responses"]["200"]
    assert run["content"]["application/json"]["schema"] != {}


def test_shaders_served_as_text(client):
    r = client.get("/shaders/00_selftest.wgsl")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "@compute" in r.text


def test_missing_static_is_404(client):
    assert client.get("/static/js/nope.js").status_code == 404
    assert client.get("/shaders/nope.wgsl").status_code == 404
