"""`andrea train`: run the training page in headless Chromium through Playwright, so a run can be
scripted or done on a GPU server without a desktop. Same page, same engine, same telemetry.

It fails fast and says why in one line: a config the server refuses (exit 2), a server that does
not answer, a page or module error, a failed asset or shader request, a GPU that cannot hold the
run (exit 1). Ctrl-C stops the run (status `stopped`) and exits 130. With `--json`, stdout is
exactly one JSON object, on success and on failure; progress always goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
import typing
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("ANDREA_CHROMIUM", "/usr/bin/chromium")
QUIET = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
SWIFTSHADER = ["--enable-unsafe-webgpu", "--enable-unsafe-swiftshader",
               "--use-webgpu-adapter=swiftshader"]
GPU = ["--enable-unsafe-webgpu", "--enable-features=Vulkan", "--ignore-gpu-blocklist"]

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
CONNECT_S = 5           # a server that does not answer within this is reported, not waited for
SERVER_GONE_S = 10      # a server that stops answering mid-run for this long ends the run
STOP_GRACE_S = 30       # after Ctrl-C: time for the page to stop, upload and commit


class TrainError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


# ---- arguments: one flag per RunConfig field -----------------------------------------------------

def _run_config():
    from andrea.run_config import RunConfig
    return RunConfig


def _flag_type(annotation):
    """(argparse kwargs) for a RunConfig field's type: choices for a Literal, a switch for bool."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    return {"type": annotation}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    config = parser.add_argument_group("run config (left out: the server's default)")
    for name, field in _run_config().model_fields.items():
        if name == "parent":   # set through --branch (a run and a step), not as a raw object
            continue
        kwargs = _flag_type(field.annotation)
        default = "tiny" if name == "preset" else field.default
        help_text = "; ".join(filter(None, [
            field.description, None if default is None else f"default: {default}"]))
        config.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                            help=help_text.replace("%", "%%"), **kwargs)
    parser.add_argument("--headless", action="store_true",
                        help="accepted; train is always headless")
    parser.add_argument("--resume", metavar="RUN_ID",
                        help="continue a stopped or interrupted run from its last checkpoint "
                             "(with the run's own config: no config flags)")
    parser.add_argument("--branch", metavar="RUN_ID[@STEP]",
                        help="a NEW run that continues RUN_ID from its checkpoint STEP (default: "
                             "its last), with RUN_ID's config changed by the config flags given "
                             "(e.g. a failed run again with a lower --lr)")
    parser.add_argument("--server", help="an Andrea server URL (default: start one for this run)")
    parser.add_argument("--data-dir", type=Path,
                        help="data dir of the server started for this run "
                             "(default: ANDREA_DATA_DIR or the platform's user data folder)")
    parser.add_argument("--gpu", action="store_true",
                        help="use the machine's GPU through Vulkan instead of SwiftShader")
    parser.add_argument("--timeout", type=float, default=24 * 3600,
                        help="seconds before giving up on the run (default: a day)")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON object on stdout (progress goes to stderr)")


def run_config(args: argparse.Namespace) -> dict:
    """The config flags given, validated here first so a bad one fails before any server starts."""
    from pydantic import ValidationError

    fields = _run_config().model_fields
    config = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    if getattr(args, "branch", None):
        if getattr(args, "resume", None):
            raise TrainError("--resume and --branch exclude each other", EXIT_USAGE)
        return config     # validated by the server on top of the parent's config
    if getattr(args, "resume", None):
        if config:
            given = ", ".join("--" + k.replace("_", "-") for k in config)
            raise TrainError(f"--resume continues the run with its own config; drop {given}",
                             EXIT_USAGE)
        return config
    config.setdefault("preset", "tiny")
    try:
        _run_config().model_validate(config)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        raise TrainError(f"{where}: {first['msg']}", EXIT_USAGE) from None
    return config


# ---- HTTP ----------------------------------------------------------------------------------------

def _http(method: str, url: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        try:
            detail = json.loads(detail)["detail"]
            if isinstance(detail, list):   # pydantic errors: where and why
                detail = "; ".join(f"{'.'.join(map(str, d['loc'][1:]))}: {d['msg']}"
                                   for d in detail)
        except (ValueError, KeyError, TypeError):
            pass
        code = EXIT_USAGE if e.code in (400, 404, 409, 422) else EXIT_FAILED
        raise TrainError(f"{method} {urllib.parse.urlparse(url).path}: {e.code} {detail}",
                         code) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        u = urllib.parse.urlparse(url)
        raise TrainError(f"the server at {u.scheme}://{u.netloc} does not answer: {reason}") \
            from None


# ---- the command ---------------------------------------------------------------------------------

def train(args: argparse.Namespace) -> int:
    result: dict = {"ok": False, "run_id": None, "server": args.server, "data_dir": None}
    secret: dict = {}   # the run's write token: used, never printed
    code = 0
    proc = None
    try:
        config = run_config(args)
        if not args.server:
            proc = _start_server(args, result)
        result["server"] = result["server"].rstrip("/")
        code = _train(args, config, result, secret)
    except TrainError as e:
        result["error"] = str(e)
        code = e.code
    except KeyboardInterrupt:   # outside the page's watch: tell the server if the run is live
        if _stop_by_socket(result, secret.get("token"), "interrupted from the command line"):
            result["status"] = "stopped"
        result["error"] = "interrupted"
        code = EXIT_INTERRUPTED
    finally:
        if proc is not None:
            from andrea.launch import stop_server
            stop_server(proc)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        _progress_end()
        if result.get("error"):
            print(f"andrea train: {result['error']}", file=sys.stderr)
        print("\n".join(f"{k:16s} {v}" for k, v in result.items() if k != "error"))
    return code


def _start_server(args, result: dict):
    from andrea.config import Settings
    from andrea.launch import start_server

    data_dir = args.data_dir or Settings().data_dir
    result["data_dir"] = str(Path(data_dir).resolve())
    _progress(f"starting a server (data in {result['data_dir']})")
    try:
        proc, url = start_server(Path(data_dir))
    except RuntimeError as e:
        raise TrainError(str(e)) from None
    result["server"] = url
    return proc


def _train(args, config: dict, result: dict, secret: dict) -> int:
    url = result["server"]
    _http("GET", url + "/healthz", timeout=CONNECT_S)
    if args.resume:   # a new write token; the tab that trained it before is refused from now on
        resumed = _http("POST", f"{url}/api/runs/{args.resume}/resume")
        run = {"id": args.resume, "token": resumed["token"], "config": resumed["run"]["config"]}
        how = f"resumed from step {resumed['step']}"
    elif args.branch:
        config = _branch_config(url, args.branch, config)
        run = _http("POST", url + "/api/runs", config)
        how = f"branched from {config['parent']['run']} at step {config['parent']['step']}"
    else:
        run = _http("POST", url + "/api/runs", config)
        how = "new"
    result["run_id"] = run["id"]
    secret["token"] = run["token"]
    steps = run["config"]["steps"]
    _progress(f"run {run['id']} on {url} ({how}): {run['config']['preset']}, "
              f"{run['config']['optimizer']}, {steps} steps")
    page = _drive_page(args, url, run, steps, result)
    metrics = _http("GET", f"{url}/api/runs/{run['id']}/metrics")
    info = _http("GET", f"{url}/api/runs/{run['id']}")
    final = next((m for m in reversed(metrics) if m.get("loss") is not None), None)
    step_ms = sorted(m["step_ms"] for m in metrics if m.get("step_ms"))
    result.update({
        "status": info["status"], "steps": len(metrics),
        "final_loss": final["loss"] if final else None,
        "final_grad_norm": final["grad_norm"] if final else None,
        "median_step_ms": step_ms[len(step_ms) // 2] if step_ms else None,
        "readback": page["stats"]})
    if page["interrupted"]:
        result["error"] = "interrupted"
        return EXIT_INTERRUPTED
    result["ok"] = page["done"] == "finished" and not page["errors"]
    if not result["ok"]:
        reasons = [*page["errors"], page["error_text"],
                   None if page["done"] else f"no result within {args.timeout:.0f} s"]
        result["error"] = "; ".join(dict.fromkeys(r for r in reasons if r)) or \
            f"the run ended {page['done']}"
        return EXIT_FAILED
    return 0


def _branch_config(url: str, branch: str, changes: dict) -> dict:
    """The parent's config with the given flags on top, and where it comes from."""
    parent_id, _, step = branch.partition("@")
    parent = _http("GET", f"{url}/api/runs/{parent_id}")
    if step:
        if not step.isdigit():
            raise TrainError(f"--branch {branch}: STEP must be a number", EXIT_USAGE)
        step = int(step)
    else:   # the newest checkpoint whose records are all committed
        listed = _http("GET", f"{url}/api/runs/{parent_id}/checkpoints")
        usable = [c["step"] for c in listed if c["step"] <= (parent.get("last_step") or 0)]
        if not usable:
            raise TrainError(f"run {parent_id} has no checkpoint to branch from", EXIT_USAGE)
        step = max(usable)
    config = {k: v for k, v in parent["config"].items()
              if k in _run_config().model_fields and k != "parent"}
    return {**config, **changes, "parent": {"run": parent_id, "step": step}}


def _drive_page(args, url: str, run: dict, steps: int, result: dict) -> dict:
    """Opens the run page with the write token in sessionStorage (never in the URL), so the page
    trains the run; watches it until done, failing fast on page, asset and server errors."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    run_id = run["id"]
    origin = urllib.parse.urlparse(url)
    errors: list[str] = []

    def on_response(response):
        # A missing module, stylesheet or shader leaves the page half-built and silent.
        u = urllib.parse.urlparse(response.url)
        if response.status >= 400 and u.netloc == origin.netloc and \
                u.path.startswith(("/static/", "/shaders/", "/runs/")):
            errors.append(f"GET {u.path}: HTTP {response.status}")

    def on_failed(request):
        u = urllib.parse.urlparse(request.url)
        if u.netloc == origin.netloc and u.path.startswith(("/static/", "/shaders/")):
            errors.append(f"GET {u.path} failed: {request.failure}")

    page_state = {"done": None, "errors": errors, "error_text": None, "stats": None,
                  "interrupted": False}
    with sync_playwright() as p:
        # Ctrl-C is ours to handle: the browser must live on to stop the run cleanly.
        browser = p.chromium.launch(
            executable_path=CHROMIUM, handle_sigint=False, handle_sigterm=False,
            handle_sighup=False,
            args=["--headless=new", *QUIET, *(GPU if args.gpu else SWIFTSHADER)])
        page = browser.new_page()
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on("response", on_response)
        page.on("requestfailed", on_failed)
        saved = json.dumps(json.dumps({"token": run["token"]}))
        page.add_init_script(f"sessionStorage.setItem('andrea.run.{run_id}', {saved});")
        try:
            page.goto(f"{url}/runs/{run_id}")
            page_state["done"] = _watch(page, url, run_id, steps, errors, args.timeout)
        except KeyboardInterrupt:
            page_state["interrupted"] = True
            _progress("\ninterrupted: stopping the run")
            page_state["done"] = _stop_page(page, result, run["token"])
        except PlaywrightError as e:
            errors.append(f"browser: {str(e).splitlines()[0]}")
        try:
            page_state["error_text"] = page.evaluate(
                "document.getElementById('error')?.hidden === false"
                " ? document.getElementById('error').textContent : null")
            page_state["stats"] = page.evaluate(
                "window.andreaTrainer ? window.andreaTrainer.stats : null")
        except PlaywrightError:
            pass
        browser.close()
    return page_state


def _watch(page, url: str, run_id: str, steps: int, errors: list[str], timeout: float):
    deadline = time.monotonic() + timeout
    unanswered_since = None
    while time.monotonic() < deadline:
        done = page.evaluate("document.body?.dataset.done || null")
        if done or errors:
            return done
        try:
            info = _http("GET", f"{url}/api/runs/{run_id}", timeout=CONNECT_S)
            unanswered_since = None
            _progress_bar(info.get("last_step") or 0, steps, info.get("last_loss"))
        except TrainError as e:
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since > SERVER_GONE_S:
                errors.append(str(e))
                return None
        page.wait_for_timeout(500)
    return None


def _stop_page(page, result: dict, token: str):
    """Ctrl-C: the page stops the trainer, uploads the weights and commits every record; if the
    page cannot (the browser went down with the signal), the server is told over the socket."""
    from playwright.sync_api import Error as PlaywrightError

    try:
        if page.evaluate("Boolean(window.andreaTrainer)"):
            page.evaluate("window.andreaTrainer.stop('interrupted from the command line')")
            page.wait_for_function("document.body.dataset.done", timeout=STOP_GRACE_S * 1000)
            return page.evaluate("document.body.dataset.done")
    except (PlaywrightError, KeyboardInterrupt):
        pass
    _stop_by_socket(result, token, "interrupted from the command line")
    return "stopped"


def _stop_by_socket(result: dict, token: str | None, message: str) -> bool:
    """Marks a live run stopped through the trainer socket (hello with the token, then status);
    True if it did. A run that already ended is left as it is."""
    run_id, url = result.get("run_id"), result.get("server")
    if not (token and run_id and url):
        return False
    try:
        status = _http("GET", f"{url}/api/runs/{run_id}", timeout=CONNECT_S)["status"]
    except TrainError:
        return False
    if status not in ("created", "running", "paused"):
        return False
    from websockets.sync.client import connect

    ws_url = url.replace("http", "ws", 1) + f"/ws/runs/{run_id}"
    try:
        with connect(ws_url, open_timeout=CONNECT_S, close_timeout=2) as ws:
            ws.send(json.dumps({"type": "hello", "token": token, "last_acked_step": None}))
            ws.recv(timeout=CONNECT_S)
            ws.send(json.dumps({"type": "status", "status": "stopped", "message": message}))
            ws.send(json.dumps({"type": "ping"}))
            ws.recv(timeout=CONNECT_S)   # pong: the status before it is committed
        return True
    except Exception as e:  # the server is gone too: nothing more to tell it
        _progress(f"could not mark the run stopped: {e}")
        return False


# ---- progress on stderr --------------------------------------------------------------------------

_tty = sys.stderr.isatty()
_logged_tenth = {"value": -1}


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _progress_bar(done: int, total: int, loss, width: int = 30) -> None:
    """A bar redrawn in place on a terminal; in a log, a line per tenth of the run."""
    loss_s = "-" if loss is None else f"{loss:.4f}"
    if not _tty:
        tenth = 10 * done // max(total, 1)
        if tenth != _logged_tenth["value"]:
            _logged_tenth["value"] = tenth
            print(f"step {done}/{total} loss {loss_s}", file=sys.stderr, flush=True)
        return
    filled = int(width * done / max(total, 1))
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} loss {loss_s}",
          end="", file=sys.stderr, flush=True)


def _progress_end() -> None:
    if _tty:
        print(file=sys.stderr)
