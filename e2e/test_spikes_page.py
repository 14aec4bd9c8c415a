"""The run page's spike list: a run whose records hold a planted spike (through the trainer
socket, as a training tab sends them) shows it, and opening it shows the anatomy: the reasons,
the outlier row with its source and its text from the run's own batch, and with per-tensor
records the tensors and the layer that carried it, its non-finite elements and the numerical
flags."""

import json

import httpx
from websockets.sync.client import connect

from e2e.tensor_records import layout_names, send, tensor_records
from tests.trainer_client import new_run
from tests.unit.test_spikes import run as synthetic_records


def test_the_spike_list_shows_a_spikes_outlier_row_with_its_source_and_text(page, live_server):
    made = httpx.post(f"{live_server}/api/runs",
                      json={"preset": "tiny", "batch_size": 4, "steps": 80}).json()
    records = [{**r, "row_losses": [round(r["loss"], 3)] * 4} for r in synthetic_records(n=80)]
    records[59]["grad_norm"] = 9.0                         # step 60: row 2 far above the rest
    records[59]["row_losses"] = [4.0, 4.1, 12.5, 3.9]
    with connect(live_server.replace("http", "ws", 1) + f"/ws/runs/{made['id']}") as ws:
        ws.send(json.dumps({"type": "hello", "token": made["token"]}))
        assert json.loads(ws.recv(timeout=15))["type"] == "welcome"
        ws.send(json.dumps({"type": "metrics", "records": records}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "ack", "step": 80}
        ws.send(json.dumps({"type": "status", "status": "finished"}))
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=15)) == {"type": "pong"}
    (spike,) = httpx.get(f"{live_server}/api/runs/{made['id']}/spikes",
                         timeout=300).json()["spikes"]   # (the first one prepares the corpus)
    row = spike["rows"][0]
    assert row["row"] == 2 and row["source"] and row["text"]

    page.goto(f"{live_server}/runs/{made['id']}")
    page.wait_for_selector("#spikes[data-count='1']")
    # The grad norm chart marks it: its 'spike' series holds the norm at step 60 alone.
    page.wait_for_function("window.andreaCharts.norm.plot.data[4]?.filter((v) => v !== null)"
                           ".length === 1")
    marked = page.evaluate("""(() => { const d = window.andreaCharts.norm.plot.data;
        const i = d[4].findIndex((v) => v !== null); return [d[0][i], d[4][i]]; })()""")
    assert marked == [60, 9.0]
    item = page.locator("#spikes details.spike")
    assert item.get_attribute("data-step") == "60"
    assert "step 60: grad norm 9.00" in item.locator("summary").inner_text()
    item.locator("summary").click()
    body = item.inner_text()
    assert "median of the last" in body
    assert "row 2: loss 12.500" in body and f"from {row['source']}" in body
    assert item.locator("pre").first.text_content() == row["text"]   # its top row first


def test_a_spikes_anatomy_names_its_tensor_its_layer_and_its_numerical_flags(page, live_server):
    made = new_run(live_server, batch_size=4, steps=80)
    names = layout_names(live_server, made["id"])
    tensor = "model.layers.1.mlp.down_proj.weight"
    records = tensor_records(names, spike={"step": 60, "tensor": tensor, "norm": 9.0})
    records[59]["softmax_denom_min"] = 1.002                # one token takes a row: collapsed
    q = names.index("model.layers.0.self_attn.q_proj.weight")
    records[69].update(grad_nonfinite=3,
                       tensor_nonfinite=[3 if i == q else 0 for i in range(len(names))])
    send(live_server, made, records)
    spikes = httpx.get(f"{live_server}/api/runs/{made['id']}/spikes", timeout=300).json()["spikes"]
    assert [s["step"] for s in spikes] == [60, 70]

    page.goto(f"{live_server}/runs/{made['id']}")
    page.wait_for_selector("#spikes[data-count='2']")
    spike = page.locator("#spikes details.spike[data-step='60']")
    norms = records[59]["tensor_grad_norms"]
    share = norms[names.index(tensor)] ** 2 / sum(v * v for v in norms)
    assert spike.locator("summary").inner_text() == (
        f"step 60: grad norm 9.00, {spikes[0]['ratio']:.1f}x the median of the "
        f"{spikes[0]['level_steps']} steps before, mostly {tensor} ({share * 100:.1f} %)")
    # A spike for its non-finite elements, not its ratio: it leads with that reason, so its
    # ratio (below the rule's factor, as the header says it may be) contradicts nothing.
    assert spikes[1]["kinds"] == ["nonfinite_elements"] and spikes[1]["ratio"] < 3
    summary = page.locator("#spikes details.spike[data-step='70'] summary").inner_text()
    assert summary.startswith("step 70: 3 non-finite gradient elements (grad norm "), summary
    assert f", {spikes[1]['ratio']:.1f}x the median of the {spikes[1]['level_steps']} steps " \
        "before)" in summary, summary
    rule = page.inner_text("#spikes-rule")
    assert "at least 3x the median" in rule and "Each entry says which" in rule, rule
    spike.locator("summary").click()
    top = spike.locator("table.spike-tensors tbody tr").first
    assert top.get_attribute("data-index") == str(names.index(tensor))
    assert top.locator("td").all_inner_texts()[::2] == [tensor, f"{share * 100:.1f} %"]
    assert spike.locator(".spike-layer").inner_text().startswith("Layer: layer 1, ")
    assert spike.locator(".spike-flag[data-flag='softmax_collapse']").inner_text() == \
        next(f["text"] for f in spikes[0]["numerical"] if f["flag"] == "softmax_collapse")
    assert spike.locator(".spike-kernel").inner_text() == (
        f"Loss kernel: largest |logit| {records[59]['logit_max']:.4g}, smallest softmax "
        "denominator 1.002 (1: one token takes a row)")
    # Opening it moved the charts to its step.
    x = page.evaluate("window.andreaCharts.loss.plot.scales.x")
    assert x["min"] < 60 < x["max"] and x["max"] - x["min"] < 79

    nan = page.locator("#spikes details.spike[data-step='70']")
    nan.locator("summary").click()
    assert nan.locator(".spike-nonfinite").inner_text() == \
        "Non-finite gradient elements: 3 in 1 tensor (model.layers.0.self_attn.q_proj.weight: 3)"
    assert nan.locator(".spike-flag[data-flag='nonfinite_grad']").is_visible()
