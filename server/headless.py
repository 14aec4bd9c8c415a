"""`andrea train --headless`: run the training page in Chromium through Playwright, so a run can
be scripted or done on a GPU server without a desktop. Same page, same engine, same telemetry."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("ANDREA_CHROMIUM", "/usr/bin/chromium")
QUIET = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
SWIFTSHADER = ["--enable-unsafe-webgpu", "--enable-unsafe-swiftshader",
               "--use-webgpu-adapter=swiftshader"]
GPU = ["--enable-unsafe-webgpu", "--enable-features=Vulkan", "--ignore-gpu-blocklist"]


def _http(method: str, url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        raise SystemExit(f"andrea train: {method} {url} failed: {e.code} {detail}") from None


@contextlib.contextmanager
def own_server(data_dir: Path | None = None):
    """`andrea serve` on a free loopback port for the duration of the block; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="andrea-"))
    log = open(data_dir / "server.log", "a") if data_dir.is_dir() else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "server", "serve", "--port", str(port),
                             "--data-dir", str(data_dir), "--no-warm-data"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise SystemExit(f"andrea train: the server exited with code {proc.returncode}")
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _bar(done: int, total: int, loss, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    loss_s = "-" if loss is None else f"{loss:.4f}"
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} loss {loss_s}"


def train(args) -> int:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("andrea train --headless needs Playwright: pip install 'andrea[headless]'",
              file=sys.stderr)
        return 2
    config = {"preset": args.preset, "optimizer": args.optimizer, "steps": args.steps,
              "seed": args.seed, "f16_mirror": args.f16_mirror, "clip": not args.no_clip}
    for key in ("batch_size", "lr", "max_norm", "data_mode"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    server = (contextlib.nullcontext(args.server.rstrip("/")) if args.server
              else own_server(Path(args.data_dir) if args.data_dir else None))
    with server as url:
        run = _http("POST", url + "/api/runs", config)
        run_id = run["id"]
        if not args.json:
            print(f"run {run_id} on {url}: {args.preset}, {args.optimizer}, {args.steps} steps",
                  flush=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM,
                                        args=["--headless=new", *QUIET,
                                              *(GPU if args.gpu else SWIFTSHADER)])
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            saved = json.dumps(json.dumps({"token": run["token"]}))
            page.add_init_script(f"sessionStorage.setItem('andrea.run.{run_id}', {saved});")
            page.goto(f"{url}/runs/{run_id}")
            deadline = time.monotonic() + args.timeout
            done = None
            while time.monotonic() < deadline:
                done = page.evaluate("document.body.dataset.done || null")
                info = _http("GET", f"{url}/api/runs/{run_id}")
                if not args.json:
                    print(_bar(info.get("last_step") or 0, args.steps, info.get("last_loss")),
                          end="", flush=True)
                if done or errors:
                    break
                time.sleep(0.5)
            error_text = page.evaluate("document.getElementById('error')?.hidden === false"
                                       " ? document.getElementById('error').textContent : null")
            stats = page.evaluate("window.andreaTrainer ? window.andreaTrainer.stats : null")
            browser.close()
        metrics = _http("GET", f"{url}/api/runs/{run_id}/metrics")
        info = _http("GET", f"{url}/api/runs/{run_id}")
    final = next((m for m in reversed(metrics) if m.get("loss") is not None), None)
    ok = done == "finished" and not errors
    result = {"run_id": run_id, "status": info["status"], "steps": len(metrics),
              "final_loss": final["loss"] if final else None,
              "final_grad_norm": final["grad_norm"] if final else None,
              "median_step_ms": sorted(m["step_ms"] for m in metrics if m.get("step_ms"))[
                  len(metrics) // 2] if metrics else None,
              "readback": stats, "ok": ok}
    if not ok:
        result["error"] = "; ".join(filter(None, [*errors, error_text,
                                                  None if done else "timed out"]))
    if args.json:
        print(json.dumps(result))
    else:
        print()
        for k, v in result.items():
            print(f"{k:16s} {v}")
    return 0 if ok else 1
