"""The gradient-norm heatmap of the run page and the per-layer overlay of the compare page, on
runs whose synthetic records carry per-tensor gradient norms (posted through the trainer
socket: e2e/tensor_records.py): one row per layer of the run's layout (or per tensor), the
planted spike's cell found under the cursor with its tensor, the page's zoom shared; runs
recorded without per-tensor norms have no heatmap and are listed as such on the compare page."""

import math

from e2e.tensor_records import layout_names, send, tensor_records
from tests.trainer_client import new_run
from tests.unit.test_spikes import run as plain_records

SPIKE = {"step": 60, "tensor": "model.layers.1.mlp.down_proj.weight", "norm": 9.0}

# The page position of a cell: step `step` (x) in row `label` (y), through the plot's own scale.
CELL_AT = """([step, label]) => { const h = window.andreaHeatmap; const u = h.chart.plot;
    const rect = u.over.getBoundingClientRect(); const R = h.rows.labels.length;
    const r = h.rows.labels.indexOf(label);
    return [rect.left + u.valToPos(step, 'x'), rect.top + (r + 0.5) * rect.height / R]; }"""


def _layer_norm(record: dict, names: list[str], prefix: str) -> float:
    return math.sqrt(sum(v * v for n, v in zip(names, record["tensor_grad_norms"])
                         if n.startswith(prefix)))


def test_the_heatmap_has_a_row_per_layer_and_finds_the_spikes_tensor_under_the_cursor(
        page, live_server, page_errors):
    run = new_run(live_server, batch_size=4, steps=80)
    names = layout_names(live_server, run["id"])
    records = tensor_records(names, spike=SPIKE)
    send(live_server, run, records)

    page.goto(f"{live_server}/runs/{run['id']}")
    page.wait_for_selector("#heatmap-card:not([hidden])[data-rows='4']")
    assert page.evaluate("window.andreaHeatmap.rows.labels") == \
        ["embed", "layer 0", "layer 1", "final norm"]
    page.wait_for_function("window.andreaHeatmap.bins?.x0.length === 80")
    page.locator("#heatmap-card").scroll_into_view_if_needed()
    x, y = page.evaluate(CELL_AT, [60, "layer 1"])
    page.mouse.move(x, y)
    hover = page.locator("#heatmap-hover")
    assert hover.get_attribute("data-row") == "layer 1"
    assert hover.get_attribute("data-step") == "60"
    assert hover.get_attribute("data-tensor") == SPIKE["tensor"]
    text = hover.inner_text()
    assert text.startswith("layer 1: step 60, grad norm ")
    assert "mostly layers.1.mlp.down_proj" in text
    shown = page.evaluate("""(() => { const h = window.andreaHeatmap;
        const c = h.bins.x0.findIndex((x0, i) => x0 <= 60 && 60 < h.bins.x1[i]);
        return h.bins.vals[2][c]; })()""")
    want = _layer_norm(records[59], names, "model.layers.1.")
    assert math.isclose(shown, want, rel_tol=1e-12)

    # Per tensor: a row per tensor of the layout; the spike's cell is the hottest colour.
    page.select_option("#heatmap-mode", "tensor")
    page.wait_for_selector(f"#heatmap-card[data-rows='{len(names)}']")
    page.wait_for_function("window.andreaHeatmap.bins?.vals.length > 4")
    page.locator("#heatmap-card").scroll_into_view_if_needed()
    x, y = page.evaluate(CELL_AT, [60, "layers.1.mlp.down_proj"])
    page.mouse.move(x, y)
    assert hover.get_attribute("data-row") == SPIKE["tensor"]
    assert hover.inner_text().startswith(f"{SPIKE['tensor']}: step 60, grad norm ")
    rgb = page.evaluate("""([x, y]) => { const u = window.andreaHeatmap.chart.plot;
        const r = u.over.getBoundingClientRect(); const k = devicePixelRatio;
        const left = u.bbox.left + (x - r.left) * k, top = u.bbox.top + (y - r.top) * k;
        const px = u.ctx.getImageData(Math.round(left), Math.round(top), 1, 1).data;
        return [...px].slice(0, 3); }""",
                        [x, y])
    assert rgb[0] > 200 and rgb[1] > 200 and rgb[2] < 100, rgb      # the palette's top: yellow
    assert "log scale" in page.inner_text("#heatmap-legend")
    hottest = max(v for r in records for v in r["tensor_grad_norms"])
    assert page.inner_text("#heatmap-legend .heat-max") == f"{hottest:.4g}"

    # The page's zoom reaches the heatmap (one x scale for every chart).
    page.evaluate("window.andreaCharts.norm.plot.setScale('x', {min: 50, max: 70})")
    assert page.evaluate("[window.andreaHeatmap.chart.plot.scales.x.min, "
                         "window.andreaHeatmap.chart.plot.scales.x.max]") == [50, 70]
    assert not page_errors


def test_a_run_without_per_tensor_norms_has_no_heatmap(page, live_server, page_errors):
    run = new_run(live_server, batch_size=4, steps=40)
    send(live_server, run, plain_records(n=40))
    page.goto(f"{live_server}/runs/{run['id']}")
    page.wait_for_selector("#charts[data-steps='40']")
    page.wait_for_function("window.andreaCharts.norm.plot.data[0].length === 40")
    assert page.locator("#heatmap-card").is_hidden()
    assert not page_errors


def test_the_compare_page_overlays_a_layers_norm_of_each_run(page, live_server, page_errors):
    runs = [new_run(live_server, batch_size=4, steps=80) for _ in range(3)]
    names = layout_names(live_server, runs[0]["id"])
    sent = [tensor_records(names, spike=SPIKE, seed=1), tensor_records(names, seed=2),
            plain_records(n=80)]
    for run, records in zip(runs, sent):
        send(live_server, run, records)
    page.goto(f"{live_server}/compare?ids={','.join(r['id'] for r in runs)}")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#layers-card:not([hidden])")
    options = page.eval_on_selector_all("#layer option", "os => os.map((o) => o.value)")
    assert options == ["all layers total", "embed", "layer 0", "layer 1", "final norm"]
    # The total is the global norm, which every run has.
    total = page.evaluate("window.andreaCharts.layer.raw")
    assert [sum(v is not None for v in col) for col in total[1:]] == [80, 80, 80]

    page.eval_on_selector("#smoothing",
                          "(el) => { el.value = '0'; el.dispatchEvent(new Event('input')); }")
    page.select_option("#layer", "layer 1")
    page.wait_for_selector("[data-chart='grad norm of the layer'][data-layer='layer 1']")
    steps, *cols = page.evaluate("window.andreaCharts.layer.raw")
    assert steps == list(range(1, 81))
    for col, records in zip(cols[:2], sent[:2]):             # the two runs with per-tensor norms
        want = [_layer_norm(r, names, "model.layers.1.") for r in records]
        assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(col, want, strict=True))
    assert cols[0][59] > 8 and cols[1][59] < 2                # the spike: the first run's alone
    assert cols[2] == [None] * 80
    missing = page.locator("#layers-missing")
    assert missing.get_attribute("data-missing") == "1"
    old = page.locator(f"#summary tr[data-run-id='{runs[2]['id']}'] a").inner_text()
    assert old in missing.inner_text()
    assert not page_errors
