import json
import os
import re

from andrea import __version__


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "version": __version__, "pid": os.getpid()}


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


def _response_schema(spec: dict, path: str, method: str, status: str = "200") -> dict:
    return spec["paths"][path][method]["responses"][status]["content"]["application/json"][
        "schema"]


def test_docs_need_no_cdn_and_the_api_is_described(client):
    assert client.get("/docs").status_code == 404
    spec = client.get("/openapi.json").json()
    components = spec["components"]["schemas"]
    # The run endpoints answer named shapes, described field by field.
    for path, method, status in [("/api/runs/{run_id}", "get", "200"),
                                 ("/api/runs", "post", "201")]:
        ref = _response_schema(spec, path, method, status)["$ref"]
        name = ref.removeprefix("#/components/schemas/")
        assert ref.startswith("#/components/schemas/") and name in components, ref
        assert {"id", "config"} <= set(components[name]["properties"]), name
    listed = _response_schema(spec, "/api/runs", "get")
    assert listed["type"] == "array" and "$ref" in listed["items"]
    for path in ["/api/runs/{run_id}/metrics", "/api/presets", "/api/presets/{name}/layout",
                 "/healthz", "/api/corpus", "/api/runs/{run_id}/data"]:
        schema = _response_schema(spec, path, "get")
        assert "$ref" in schema or "$ref" in schema.get("items", {}), (path, schema)
    assert "$ref" in _response_schema(spec, "/api/layout", "post")


def _inputs(html: str) -> dict[str, dict[str, str]]:
    """The new-run form's number inputs: name -> attributes."""
    out = {}
    for tag in re.findall(r"<input [^>]*>", html, re.S):
        attrs = dict(re.findall(r'([a-z_-]+)(?:="([^"]*)")?', tag[len("<input "):]))
        if attrs.get("type") == "number":
            out[attrs["name"]] = attrs
    return out


def test_run_form_takes_defaults_and_bounds_from_run_config(client):
    from andrea.run_config import RoomConfig, RunConfig

    fields = _inputs(client.get("/").text)
    assert {"batch_size", "steps", "seed", "lr", "warmup_steps", "eval_every"} <= set(fields)
    assert {"room.inner_steps", "room.outer_lr", "room.outer_momentum"} <= set(fields)
    for name, attrs in fields.items():
        # A room run's fields (room.<field>) are RoomConfig's.
        model, field = (RoomConfig, name[5:]) if name.startswith("room.") else (RunConfig, name)
        prop = model.model_json_schema()["properties"][field]
        bound = next(p for p in prop.get("anyOf", [prop]) if p.get("type") != "null")
        default = model.model_fields[field].default
        if default is None:     # the server decides: empty, and may stay empty
            assert attrs["value"] == "" and "required" not in attrs, name
        else:
            assert float(attrs["value"]) == default and "required" in attrs, name
        if "minimum" in bound:
            assert float(attrs["min"]) == bound["minimum"], name
        if "maximum" in bound:
            assert float(attrs["max"]) == bound["maximum"], name
        # A float's exclusive bound (lr > 0) is HTML's min plus a mark the page checks; an
        # integer's is the next integer in.
        integer = bound["type"] == "integer"
        if "exclusiveMinimum" in bound:
            assert float(attrs["min"]) == bound["exclusiveMinimum"] + integer, name
        assert ("data-min-exclusive" in attrs) == ("exclusiveMinimum" in bound and not integer)
    assert "data-min-exclusive" in fields["lr"] and "data-min-exclusive" in fields["max_norm"]


def test_checkpoint_api_is_described(client):
    spec = client.get("/openapi.json").json()
    components = spec["components"]["schemas"]
    for path, method, status, fields in [
            ("/api/runs/{run_id}/checkpoints/{step}", "put", "201", {"step", "bytes", "sha256"}),
            ("/api/runs/{run_id}/resume", "post", "200", {"token", "step", "run"})]:
        ref = _response_schema(spec, path, method, status)["$ref"]
        assert set(components[ref.rsplit("/", 1)[1]]["properties"]) == fields, path
    listed = _response_schema(spec, "/api/runs/{run_id}/checkpoints", "get")
    assert listed["type"] == "array" and "$ref" in listed["items"]
    assert "application/octet-stream" in \
        spec["paths"]["/api/runs/{run_id}/checkpoints/{step}"]["get"]["responses"]["200"][
            "content"]
    run = components["Run"]["properties"]
    assert {"checkpoint", "can_resume"} <= set(run)


def test_shaders_served_as_text(client):
    r = client.get("/shaders/00_selftest.wgsl")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "@compute" in r.text


def test_missing_static_is_404(client):
    assert client.get("/static/js/nope.js").status_code == 404
    assert client.get("/shaders/nope.wgsl").status_code == 404


def test_custom_layout_defaults_are_the_model_configs(client):
    from andrea.model import ModelConfig

    r = client.post("/api/layout", json={})
    assert r.status_code == 200, r.text
    assert r.json()["config"] == ModelConfig().to_dict()
    assert client.post("/api/layout", json={"n_embd": 1}).status_code == 422


def test_no_route_module_imports_another():
    """A route module (one with an APIRouter) imports what routes share from modules that hold
    no routes (routes/run_files.py), never another route module: each wing of the API stands
    alone, and a change to one cannot reach another through its imports."""
    import ast
    from pathlib import Path
    folder = Path(__file__).resolve().parents[2] / "server" / "routes"
    sources = {p.stem: p.read_text() for p in folder.glob("*.py") if p.stem != "__init__"}
    routers = {name for name, src in sources.items() if "APIRouter(" in src}
    assert {"runs", "checkpoints", "spikes"} <= routers
    for name in routers:
        imported = set()
        for node in ast.walk(ast.parse(sources[name])):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("andrea.routes"):
                imported.add(node.module.rsplit(".", 1)[-1])
                imported.update(a.name for a in node.names if node.module == "andrea.routes")
            elif isinstance(node, ast.Import):
                imported.update(a.name.rsplit(".", 1)[-1] for a in node.names
                                if a.name.startswith("andrea.routes."))
        assert not imported & routers, f"routes/{name}.py imports {imported & routers}"
