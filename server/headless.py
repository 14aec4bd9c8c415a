"""`andrea train`: run the training page in headless Chromium through Playwright, so a run can be
scripted or done on a GPU server without a desktop. Same page, same engine, same telemetry.
This module is the command (arguments, the server's HTTP API, the result); andrea.chromium finds,
launches and checks the browser and drives the page.

It never ends in a traceback: every failure is one line on stderr ("andrea train: <reason>") and,
with `--json`, one JSON object on stdout (ok false, an `error` field). Exit 2: a config the
server refuses. Exit 1: everything else that fails: Playwright missing or broken, no browser at
ANDREA_CHROMIUM (/usr/bin/chromium by default), a browser that does not start, no WebGPU
adapter (these four are checked before any run is created), a server that does not answer, a
page or module error, a failed asset or shader request, a GPU that cannot hold the run. A run
that was created but never trained is not left `created`: see _settle_untrained. Ctrl-C stops
the run (status `stopped`) and exits 130. Progress always goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import types
import typing
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from andrea.chromium import (  # noqa: F401  (tests/browser.py imports the browser from here)
    CHROMIUM,
    DEFAULT_CHROMIUM,
    GPU,
    NO_DOWNLOAD,
    QUIET,
    SWIFTSHADER,
    BrowserError,
    Chromium,
)

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
CONNECT_S = 5           # a server that does not answer within this is reported, not waited for
SERVER_GONE_S = 10      # a server that stops answering mid-run for this long ends the run
MESSAGE_MAX = 2000      # a run's status message (server/telemetry.py)

# For `andrea train --help`.
BROWSER_HELP = (f"It drives the system's Chromium ({DEFAULT_CHROMIUM}: apt-get install chromium), "
                f"or the Chromium or Chrome executable that ANDREA_CHROMIUM names, through "
                f"Playwright; {NO_DOWNLOAD} (no `playwright install`).")


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
    if typing.get_origin(annotation) is list:          # sources: --sources NAME [NAME ...]
        (item,) = typing.get_args(annotation)
        return {"nargs": "+", "type": item, "metavar": "NAME"}
    if typing.get_origin(annotation) is typing.Literal:   # of strings, or of ints (vocab_size)
        choices = list(typing.get_args(annotation))
        return {"choices": choices, "type": type(choices[0])}
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
    browser = Chromium(gpu=args.gpu)
    try:
        config = run_config(args)
        # Whatever can fail without a run is checked before one is created (and before a server
        # is started for it): Playwright and the browser's executable, a given server, the
        # browser's start and its WebGPU adapter.
        browser.check()
        if args.server:
            result["server"] = args.server.rstrip("/")
            _http("GET", result["server"] + "/healthz", timeout=CONNECT_S)
        browser.launch()
        adapter = browser.probe()
        _progress(f"{browser.version} ({browser.path}), WebGPU adapter {_adapter_name(adapter)}")
        if not args.server:
            proc = _start_server(args, result)
        code = _train(args, config, result, secret, browser)
    except (TrainError, BrowserError) as e:
        result["error"] = str(e)
        code = getattr(e, "code", EXIT_FAILED)
    except KeyboardInterrupt:   # outside the page's watch: tell the server if the run is live
        if _stop_by_socket(result, secret.get("token"), "interrupted from the command line"):
            result["status"] = "stopped"
        result["error"] = "interrupted"
        code = EXIT_INTERRUPTED
    except Exception as e:   # unforeseen: still one line and one JSON object, never a traceback
        result["error"] = _unexpected(e)
        code = EXIT_FAILED
    finally:
        browser.close()
        if proc is not None:
            from andrea.launch import stop_server
            stop_server(proc)
    _report(args, result)
    return code


def _report(args, result: dict) -> None:
    """The error as one line on stderr; with --json, the result as one JSON object on stdout."""
    _progress_end()
    if result.get("error"):
        result["error"] = " ".join(str(result["error"]).split())
        print(f"andrea train: {result['error']}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print("\n".join(f"{k:16s} {v}" for k, v in result.items() if k != "error"), flush=True)


def _unexpected(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"unexpected {type(e).__name__}" + (f": {lines[0]}" if lines else "")


def _adapter_name(adapter: dict) -> str:
    name = " ".join(filter(None, (adapter.get("vendor"), adapter.get("architecture")))) or \
        adapter.get("description") or "(unnamed)"
    return name + (" (software)" if adapter.get("fallback") else "")


def _start_server(args, result: dict):
    from andrea.config import Settings
    from andrea.launch import start_server

    data_dir = args.data_dir or Settings().data_dir
    result["data_dir"] = str(Path(data_dir).resolve())
    _progress(f"starting a server (data in {result['data_dir']})")
    try:
        proc, url = start_server(Path(data_dir))
    except OSError as e:   # the data dir cannot be made or written, no interpreter to start
        raise TrainError(f"cannot start a server with data in {data_dir}: {e}") from None
    except RuntimeError as e:
        raise TrainError(str(e)) from None
    result["server"] = url
    return proc


def _train(args, config: dict, result: dict, secret: dict, browser: Chromium) -> int:
    url = result["server"]
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
    _progress(f"run {run['id']} on {url} ({how}): {run['config']['preset']}, "
              f"{run['config']['optimizer']}, {run['config']['steps']} steps")
    try:
        code = _train_in_page(args, browser, url, run, result)
    except (TrainError, BrowserError) as e:
        _settle_untrained(result, secret, str(e), resumed=bool(args.resume))
        raise
    except Exception as e:
        _settle_untrained(result, secret, _unexpected(e), resumed=bool(args.resume))
        raise
    if code == EXIT_FAILED:
        _settle_untrained(result, secret, result["error"], resumed=bool(args.resume))
    return code


def _train_in_page(args, browser: Chromium, url: str, run: dict, result: dict) -> int:
    steps = run["config"]["steps"]
    unanswered = {"since": None}

    def tick() -> str | None:   # progress; a server gone for SERVER_GONE_S ends the watch
        try:
            info = _http("GET", f"{url}/api/runs/{run['id']}", timeout=CONNECT_S)
        except TrainError as e:
            unanswered["since"] = unanswered["since"] or time.monotonic()
            return str(e) if time.monotonic() - unanswered["since"] > SERVER_GONE_S else None
        unanswered["since"] = None
        _progress_bar(info.get("last_step") or 0, steps, info.get("last_loss"))
        return None

    try:
        page = browser.drive(url, run, args.timeout, tick)
    except KeyboardInterrupt:   # Ctrl-C again while the page was stopping
        page = {"done": None, "errors": [], "error_text": None, "stats": None,
                "interrupted": True}
    if page["interrupted"]:
        if page["done"] is None:   # the page could not stop it: the server is told directly
            _stop_by_socket(result, run["token"], "interrupted from the command line")
            page["done"] = "stopped"
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
        result["error"] = one_reason([
            *page["errors"], page["error_text"],
            None if page["done"] else f"no result within {args.timeout:.0f} s"]) or \
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


# Prefixes that say where an error was seen, not what it says: the page throws an error and shows
# it too, so "page error: X" and "Cannot train here: X" are one error.
_SEEN_AS = re.compile(r"^(?:(?:page error|browser|Cannot train here|Training failed|"
                      r"Uncaught|[A-Za-z]*Error):\s*)+")


def one_reason(reasons) -> str:
    """The reasons joined, each said once: a reason whose message another reason already
    contains is dropped, keeping the more informative one (the longer; the first of equals)."""
    texts = list(dict.fromkeys(" ".join(r.split()) for r in reasons if r and r.strip()))
    kept = []
    for i, text in enumerate(texts):
        said = _SEEN_AS.sub("", text)
        if any(j != i and said in other and
               (len(other) > len(text) or (len(other) == len(text) and j < i))
               for j, other in enumerate(texts)):
            continue
        kept.append(text)
    return "; ".join(kept)


def _settle_untrained(result: dict, secret: dict, reason: str, resumed: bool) -> None:
    """A run created for this command that never trained (the page failed before its first
    step: no adapter or device there, a GPU that cannot hold it, a browser that went down) is
    not left `created`: it is marked `failed` with the reason as its message, through the
    trainer socket and the run's write token, as the page itself would have; result["status"]
    says what it is now.

    Failed with the reason rather than deleted: the run id was already printed (progress, and
    the --json result), so it must keep answering with what happened instead of a 404; the runs
    list then shows the attempt and why it never trained (this machine's browser has no adapter,
    this config does not fit), which a deleted run cannot; a branch keeps its link to its
    parent; and deleting is the user's act on /runs (a viewer may have the run open). A run
    that never trained costs only its row: no steps, no checkpoints.

    A resumed run is marked `stopped` instead: `failed` is final, and its checkpoint is as good
    as before, so it stays resumable (and its old token is revoked either way)."""
    run_id, url, token = result.get("run_id"), result.get("server"), secret.get("token")
    if not (run_id and url and token):
        return
    try:
        status = _http("GET", f"{url}/api/runs/{run_id}", timeout=CONNECT_S)["status"]
    except TrainError:
        return
    result["status"] = status
    if status not in ("created", "abandoned"):   # it trained (or the page already said): as is
        return
    status = "stopped" if resumed else "failed"
    if _set_status(url, run_id, token, status, reason[:MESSAGE_MAX]):
        result["status"] = status


def _stop_by_socket(result: dict, token: str | None, message: str) -> bool:
    """Marks a live run stopped through the trainer socket; True if it did. A run that already
    ended is left as it is."""
    run_id, url = result.get("run_id"), result.get("server")
    if not (token and run_id and url):
        return False
    try:
        status = _http("GET", f"{url}/api/runs/{run_id}", timeout=CONNECT_S)["status"]
    except TrainError:
        return False
    if status not in ("created", "running", "paused"):
        return False
    return _set_status(url, run_id, token, "stopped", message)


def _set_status(url: str, run_id: str, token: str, status: str, message: str) -> bool:
    """Tells the server the run's status as its training page would (server/telemetry.py: hello
    with the write token, then status; the pong after it means it is committed). True if it
    did. The page's own socket may not be released yet (a second trainer is refused while one
    is connected): that is waited out for a few seconds."""
    from websockets.sync.client import connect

    ws_url = url.replace("http", "ws", 1) + f"/ws/runs/{run_id}"
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            with connect(ws_url, open_timeout=CONNECT_S, close_timeout=2) as ws:
                ws.send(json.dumps({"type": "hello", "token": token, "last_acked_step": None}))
                reply = json.loads(ws.recv(timeout=CONNECT_S))
                if reply.get("type") == "welcome":
                    ws.send(json.dumps({"type": "status", "status": status, "message": message}))
                    ws.send(json.dumps({"type": "ping"}))
                    reply = json.loads(ws.recv(timeout=CONNECT_S))
                    if reply.get("type") == "pong":
                        return True
                why = reply.get("message") or str(reply)
        except Exception as e:  # the server is gone too: nothing more to tell it
            why = str(e) or type(e).__name__
        if "another trainer" in why and time.monotonic() < deadline:
            time.sleep(0.25)
            continue
        _progress(f"could not mark the run {status}: {why}")
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
