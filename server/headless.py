"""`andrea train --headless`: run the training page in Chromium through Playwright, so a run can
be scripted or done on a GPU server without a desktop. Same page, same engine, same telemetry."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from andrea.launch import start_server, stop_server

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


def _bar(done: int, total: int, loss, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    loss_s = "-" if loss is None else f"{loss:.4f}"
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} loss {loss_s}"


def train(args) -> int:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        print("andrea train --headless needs Playwright: pip install 'andrea[headless]'",
              file=sys.stderr)
        return 2
    config = {"preset": args.preset, "optimizer": args.optimizer, "steps": args.steps,
              "seed": args.seed, "f16_mirror": args.f16_mirror, "clip": not args.no_clip}
    for key in ("batch_size", "lr", "max_norm", "data_mode"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.server:
        return _train(args, config, args.server.rstrip("/"))
    try:
        proc, url = start_server(Path(args.data_dir) if args.data_dir
                                 else Path(tempfile.mkdtemp(prefix="andrea-")))
    except RuntimeError as e:
        print(f"andrea train: {e}", file=sys.stderr)
        return 2
    try:
        return _train(args, config, url)
    finally:
        stop_server(proc)


def _train(args, config: dict, url: str) -> int:
    run = _http("POST", url + "/api/runs", config)
    if not args.json:
        print(f"run {run['id']} on {url}: {args.preset}, {args.optimizer}, {args.steps} steps",
              flush=True)
    page = _drive_page(args, url, run)
    metrics = _http("GET", f"{url}/api/runs/{run['id']}/metrics")
    info = _http("GET", f"{url}/api/runs/{run['id']}")
    final = next((m for m in reversed(metrics) if m.get("loss") is not None), None)
    step_ms = sorted(m["step_ms"] for m in metrics if m.get("step_ms"))
    ok = page["done"] == "finished" and not page["errors"]
    result = {"run_id": run["id"], "status": info["status"], "steps": len(metrics),
              "final_loss": final["loss"] if final else None,
              "final_grad_norm": final["grad_norm"] if final else None,
              "median_step_ms": step_ms[len(step_ms) // 2] if step_ms else None,
              "readback": page["stats"], "ok": ok}
    if not ok:
        result["error"] = "; ".join(filter(None, [*page["errors"], page["error_text"],
                                                  None if page["done"] else "timed out"]))
    if args.json:
        print(json.dumps(result))
    else:
        print()
        for k, v in result.items():
            print(f"{k:16s} {v}")
    return 0 if ok else 1


def _drive_page(args, url: str, run: dict) -> dict:
    """Opens the run page with the write token in sessionStorage (never in the URL), so the
    page trains the run; polls until it is done, showing progress from the server."""
    from playwright.sync_api import sync_playwright

    run_id = run["id"]
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
            if not args.json:
                info = _http("GET", f"{url}/api/runs/{run_id}")
                print(_bar(info.get("last_step") or 0, args.steps, info.get("last_loss")),
                      end="", flush=True)
            if done or errors:
                break
            time.sleep(0.5)
        error_text = page.evaluate("document.getElementById('error')?.hidden === false"
                                   " ? document.getElementById('error').textContent : null")
        stats = page.evaluate("window.andreaTrainer ? window.andreaTrainer.stats : null")
        browser.close()
    return {"done": done, "errors": errors, "error_text": error_text, "stats": stats}
