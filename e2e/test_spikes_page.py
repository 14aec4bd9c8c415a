"""The run page's spike list: a run whose records hold a planted spike (through the trainer
socket, as a training tab sends them) shows it, and opening it shows the anatomy: the reasons,
and the outlier row with its source and its text from the run's own batch."""

import json

import httpx
from websockets.sync.client import connect

from tests.test_spikes import run as synthetic_records


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
