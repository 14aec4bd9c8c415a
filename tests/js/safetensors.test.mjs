// The prompt box reads a run's weights as the server serves them (export.py's safetensors
// stream) back into the flat W the engine's Model takes (app/safetensors.js).
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { test } from 'node:test';
import { flatWeights } from '../../static/js/app/safetensors.js';
import { serverJson } from './server.mjs';

test('flatWeights puts every tensor of the served file back at its table offset', () => {
  // The bytes the server's stream (export.safetensors_stream) sends for random weights of a
  // task run's model: its header, then the tensors in the header's order; W as the engine
  // holds it (padding zero) beside it.
  const { path, raw, layout } = serverJson(`
import json, tempfile, numpy as np
from andrea import export
from andrea.run_config import RunConfig, run_layout
layout = run_layout(RunConfig(preset="tiny", task="add", n_layer=1))
rng = np.random.default_rng(3)
flat = np.zeros(layout["total_numel"], np.float32)
for p in layout["params"]:
    flat[p["offset"]:p["offset"] + p["numel"]] = rng.standard_normal(p["numel"])
named = export.tensors(layout, flat)
body = export.safetensors_header(layout) + b"".join(    # in the header's order: by name
    named[n].astype("<f4").tobytes() for n in sorted(named))
f = tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False)
f.write(body)
g = tempfile.NamedTemporaryFile(suffix=".f32", delete=False)
g.write(flat.astype("<f4").tobytes())
print(json.dumps({"path": f.name, "raw": g.name, "layout": layout}))`);
  const bytes = readFileSync(path);
  const rb = readFileSync(raw);
  const flat = new Float32Array(rb.buffer.slice(rb.byteOffset, rb.byteOffset + rb.length));
  rmSync(path);
  rmSync(raw);
  const w = flatWeights(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length), layout);
  assert.equal(w.length, layout.total_numel);
  const bad = w.findIndex((x, i) => x !== flat[i]);
  assert.equal(bad, -1, `first difference at ${bad}: ${w[bad]} vs ${flat[bad]}, in ${JSON.stringify(layout.params.find((p) => p.offset <= bad && bad < p.offset + p.numel))}`);
});

test('flatWeights refuses a file without a tensor of the table, naming it', () => {
  const header = new TextEncoder().encode(JSON.stringify({ a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } }));
  const buf = new ArrayBuffer(8 + header.length + 4);
  new DataView(buf).setBigUint64(0, BigInt(header.length), true);
  new Uint8Array(buf, 8).set(header);
  const layout = { total_numel: 1, params: [{ name: 'b', offset: 0, numel: 1 }] };
  assert.throws(() => flatWeights(buf, layout), /no tensor b/);
});
