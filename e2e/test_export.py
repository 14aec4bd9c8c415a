"""A trained run exports to a Hugging Face checkpoint that LlamaForCausalLM loads as it is and
that gives the engine's logits for the same tokens."""

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch

from tests.browser import GPU_BROWSER
from tests.lab import b64, call

# A preset, and a shape of the run's own (every field off the preset's, a vocabulary of its own).
SHAPES = {"tiny": {}, "custom": {"n_layer": 3, "n_embd": 48, "n_head": 3, "ffn_dim": 96,
                                 "vocab_size": 1024}}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_trained_run_exports_to_hf_and_matches_the_engine(live_server, server_data_dir,
                                                           lab_session, tmp_path, shape):
    flags = [a for k, v in SHAPES[shape].items() for a in ("--" + k.replace("_", "-"), str(v))]
    r = subprocess.run([sys.executable, "-m", "andrea", "train", "--headless", "--preset", "tiny",
                        *flags, *(["--gpu"] if GPU_BROWSER else []), "--steps", "6",
                        "--batch-size", "2", "--server", live_server,
                        "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = json.loads(r.stdout.strip().splitlines()[-1])["run_id"]
    assert httpx.get(f"{live_server}/api/runs/{run_id}").json()["has_weights"]
    out = tmp_path / "hf"
    e = subprocess.run([sys.executable, "-m", "andrea", "export", run_id, "--out", str(out),
                        "--data-dir", str(server_data_dir)], capture_output=True, text=True)
    assert e.returncode == 0, e.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    model = LlamaForCausalLM.from_pretrained(out).eval()
    hf = model.config
    want = {"n_layer": 2, "n_embd": 64, "n_head": 4, "ffn_dim": 192, "vocab_size": 512,
            **SHAPES[shape]}
    assert (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size,
            hf.vocab_size) == tuple(want.values())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert tok.vocab_size <= want["vocab_size"]
    ids = tok("def main():\n    return 0\n")["input_ids"][:64]
    with torch.no_grad():
        hf_logits = model(input_ids=torch.tensor([ids])).logits[0].numpy()

    # The engine, from the uploaded weights, on the same tokens.
    layout = httpx.get(f"{live_server}/api/runs/{run_id}/layout").json()
    weights = np.fromfile(server_data_dir / "runs" / run_id / "weights.f32", dtype="<f4")
    T = len(ids)
    got = call(lab_session, """
        const m = await lab.createModel({layout: args.layout});
        m.setParams(args.w);
        return {logits: await m.logits(args.ids, 1, args.T)};
    """, {"layout": layout, "w": b64(weights), "ids": b64(np.array(ids, np.int32)), "T": T})
    engine = got["logits"].reshape(T, -1)
    err = np.max(np.abs(engine - hf_logits)) / np.max(np.abs(hf_logits))
    print(f"\nexported model vs engine: logits max rel err {err:.2e}")
    assert err <= 1e-5
    # The browser download is the same file.
    body = httpx.get(f"{live_server}/api/runs/{run_id}/model.safetensors").content
    assert body == (out / "model.safetensors").read_bytes()


def test_weights_upload_is_guarded(live_server):
    run = httpx.post(f"{live_server}/api/runs", json={"preset": "tiny"}).json()
    url = f"{live_server}/api/runs/{run['id']}/weights"
    assert httpx.put(url, content=b"\0" * 8).status_code == 403
    auth = {"authorization": f"Bearer {run['token']}"}
    assert httpx.put(url, content=b"\0" * 8, headers=auth).status_code == 400
    too_big = 4 * run["layout"]["total_numel"] + 4
    assert httpx.put(url, content=b"\0" * too_big, headers=auth).status_code == 413
    assert httpx.get(f"{live_server}/api/runs/{run['id']}/model.safetensors").status_code == 404
    assert httpx.put(f"{live_server}/api/runs/nope/weights", content=b"").status_code == 404
