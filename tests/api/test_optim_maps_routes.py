"""The optimizer's state accounting and 8-bit maps as the layout and maps routes serve them (the
maps and the accounting themselves: tests/unit/test_optim_maps.py)."""

from andrea.model import PRESETS, build_layout
from andrea.optim import f32_tensors, optimizer_memory, quantization_maps


def test_layout_and_maps_routes(client):
    r = client.get("/api/presets/tiny/layout")
    assert r.status_code == 200
    st = r.json()["optimizer_state"]
    assert set(st) == {"adamw", "adamw_f16", "adamw_8bit"}
    assert st["adamw_8bit"]["state_bytes"] == optimizer_memory(build_layout(PRESETS["tiny"]))[
        "adamw_8bit"]["state_bytes"]
    assert st["adamw_8bit"]["f32_tensors"] == f32_tensors(build_layout(PRESETS["tiny"]))
    r = client.post("/api/layout", json={"vocab_size": 515, "seq_len": 128, "n_layer": 3})
    assert r.json()["optimizer_state"]["adamw"]["state_bytes"] == 8 * r.json()["total_numel"]
    maps = client.get("/api/optimizer/maps").json()
    assert maps == quantization_maps()
    assert len(maps["signed"]) == len(maps["unsigned"]) == 256
    assert maps["blocksize"] == 256 and maps["min_8bit_size"] == 4096
