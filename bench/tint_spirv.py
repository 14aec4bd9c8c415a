"""What Tint makes of a WGSL kernel: the SPIR-V that Chromium's Dawn hands the Vulkan driver, from
Dawn's `dump_shaders` toggle (Dawn logs the disassembly of every shader it compiles; Chromium puts
the log on the page's console, where Playwright reads it).

The kernels are static/js/engine/mma.js's f16 subgroup-matrix matmuls (`--variant`, as in
bench_matmul_f16.mjs, with the layout of `--kind`), or `--plain`, a plain kernel that any
adapter compiles (to try this tool on SwiftShader). One .spvasm file per shader Dawn compiled
goes to --out.

    python3 -m bench.tint_spirv --gpu --variant A --kind fwd --out /tmp/spirv
    python3 -m bench.tint_spirv --plain --out /tmp/spirv              # SwiftShader
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import pathlib
import threading

from andrea.cli.browser_flags import webgpu_args
from andrea.cli.chromium import CHROMIUM

REPO = pathlib.Path(__file__).resolve().parent.parent
MARK = "Dumped SPIRV disassembly"
DAWN_TOGGLES = "allow_unsafe_apis,vulkan_enable_f16_on_nvidia,dump_shaders"

PAGE = """<!doctype html><meta charset="utf-8"><title>tint spirv</title>
<script type="module">
import { mmaShader } from '/static/js/engine/mma.js';
// A plain kernel any adapter compiles (--plain): to try this tool on SwiftShader.
const PLAIN = `@group(0) @binding(0) var<storage, read_write> x: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x < arrayLength(&x)) { x[gid.x] = 2.0 * x[gid.x]; }
}`;
const want = %(want)s;
async function main() {
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) throw new Error('no WebGPU adapter');
  const features = want.variant ? ['shader-f16', 'chromium-experimental-subgroup-matrix'] : [];
  for (const f of features) if (!adapter.features.has(f)) throw new Error(`adapter lacks ${f}`);
  const wgMem = adapter.limits.maxComputeWorkgroupStorageSize;
  const device = await adapter.requestDevice({ requiredFeatures: features,
    requiredLimits: { maxComputeWorkgroupStorageSize: wgMem } });
  const code = want.variant ? mmaShader(want.variant) : PLAIN;
  const module = device.createShaderModule({ code });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === 'error');
  const where = (m) => `${m.lineNum}:${m.linePos} ${m.message}`;
  if (errors.length) throw new Error(errors.map(where).join('\\n'));
  // Dawn's Vulkan backend generates SPIR-V when the pipeline is made (overrides are known then).
  const compute = { module, entryPoint: 'main' };
  await device.createComputePipelineAsync({ layout: 'auto', compute });
  const a = adapter.info;
  return { adapter: `${a.vendor} ${a.architecture} ${a.description}`, wgsl: code };
}
main().then((r) => { window.result = r; },
  (e) => { window.result = { error: String(e.message || e) }; });
</script>"""


def serve(page: str):
    """The checkout's files and the page at /tint.html, on 127.0.0.1 (a secure context)."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the base class's name)
            if self.path == "/tint.html":
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                super().do_GET()

        def log_message(self, *args):
            pass

        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".mjs": "text/javascript", ".js": "text/javascript"}

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(REPO)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="the machine's GPU (else SwiftShader)")
    ap.add_argument("--variant", default="A", help="a bench_matmul_f16.mjs variant id")
    ap.add_argument("--kind", default="fwd", choices=["fwd", "dx", "dW"])
    ap.add_argument("--plain", action="store_true", help="a plain kernel instead (any adapter)")
    ap.add_argument("--out", required=True, help="folder for the .spvasm and .wgsl files")
    args = ap.parse_args()
    variant = None
    if not args.plain:
        variants = json.loads((REPO / "bench" / "mma_variants.json").read_text())
        layout = {"fwd": (0, 1), "dx": (0, 0), "dW": (1, 0)}[args.kind]
        variant = {**variants[args.variant], "aT": layout[0], "bT": layout[1]}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "plain" if args.plain else f"{args.variant}_{args.kind}"
    dumps: list[str] = []
    httpd = serve(PAGE % {"want": json.dumps({"variant": variant})})
    from playwright.sync_api import sync_playwright
    with contextlib.ExitStack() as stack:
        stack.callback(httpd.shutdown)
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            *webgpu_args(args.gpu), f"--enable-dawn-features={DAWN_TOGGLES}"])
        page = browser.new_page()
        page.on("console", lambda m: dumps.append(m.text) if MARK in m.text else None)
        page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/tint.html")
        page.wait_for_function("window.result !== undefined", timeout=120_000)
        page.wait_for_timeout(1000)   # the log of the last shader may trail the pipeline
        result = page.evaluate("window.result")
        browser.close()
    if "error" in result:
        raise SystemExit(f"tint_spirv: {result['error']}")
    (out / f"{name}.wgsl").write_text(result["wgsl"])
    for i, text in enumerate(dumps):
        (out / f"{name}.{i}.spvasm").write_text(text)
    print(f"{result['adapter']}: {len(dumps)} SPIR-V dump(s) of {name} in {out}")
    for i, text in enumerate(dumps):
        ops: dict[str, int] = {}
        for line in text.splitlines():
            words = line.split("=", 1)[-1].split()
            if words and words[0].startswith("Op"):
                ops[words[0]] = ops.get(words[0], 0) + 1
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:25]
        print(f"  {name}.{i}.spvasm: {len(text.splitlines())} lines; " +
              ", ".join(f"{k} {v}" for k, v in top))


if __name__ == "__main__":
    main()
