"""`andrea train`: run the training page in headless Chromium through Playwright, so a run can be
scripted or done on a GPU server without a desktop. Same page, same engine, same telemetry.
This module is the command: it checks, creates the run (new, resumed or branched), has the page
train it and settles what it left; train_args.py holds its arguments, train_output.py what it
says, http_client.py its calls to the server, and chromium.py finds, launches and checks the
browser and drives the page.

It never ends in a traceback: every failure is one line on stderr ("andrea train: <reason>") and,
with `--json`, one JSON object on stdout (ok false, an `error` field). Exit 2: a config the
server refuses, or a bad setting of the server it starts (--data-dir, ANDREA_*). Exit 1:
everything else that fails: Playwright missing or broken, no browser at ANDREA_CHROMIUM
(/usr/bin/chromium by default), a browser that does not start, no WebGPU adapter (these four are
checked before any run is created), a server that does not answer, a page or module error, a
failed asset or shader request, a GPU that cannot hold the run. A run that was created but never
trained is not left `created`: see _settle_untrained. Ctrl-C, SIGTERM and SIGHUP stop the run
(status `stopped`) and exit 130; past --timeout the run is stopped too, and the command exits 1.
Progress always goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from andrea.checkpoints import newest_usable
from andrea.cli import http_client
from andrea.cli.chromium import BrowserError, Chromium, drive_result
from andrea.cli.room_join import join_room
from andrea.cli.stop_signals import INTERRUPTED, stop_signals_interrupt
from andrea.cli.train_args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    TrainError,
    own_server_settings,
    run_config,
    run_config_model,
)
from andrea.cli.train_output import (
    SpikeLog,
    adapter_name,
    page_exit,
    progress,
    progress_bar,
    report,
    unexpected,
)

CONNECT_S = 5           # a server that does not answer within this is reported, not waited for
# A new run is checked against the corpus, whose token files for a vocabulary size not asked
# for before are made then (seconds, minutes on a big corpus or a loaded machine).
CREATE_S = 600
SERVER_GONE_S = 10      # a server that stops answering mid-run for this long ends the run
MESSAGE_MAX = 2000      # a run's status message (server/telemetry/protocol.py)
MAX_DEVICE_LOSSES = 3   # resumes after a lost GPU device before the command gives up


# ---- HTTP ----------------------------------------------------------------------------------------

def _http(method: str, url: str, body: dict | None = None, timeout: float = 30,
          token: str | None = None) -> dict:
    """The server's JSON answer; a refusal of what was asked exits 2, anything else 1."""
    try:
        return http_client.request(method, url, body, timeout, token=token)
    except http_client.ServerError as e:
        code = EXIT_USAGE if e.status in (400, 404, 409, 422) else EXIT_FAILED
        raise TrainError(str(e), code) from None
    except http_client.Unreachable as e:
        raise TrainError(str(e)) from None


# ---- the command ---------------------------------------------------------------------------------

def train(args: argparse.Namespace) -> int:
    with stop_signals_interrupt():
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    result: dict = {"ok": False, "run_id": None, "server": args.server, "data_dir": None}
    # The run's write token: used, and printed only inside the run's resume link.
    secret: dict = {}
    code = 0
    proc = None
    browser = Chromium(gpu=args.gpu)
    try:
        config = run_config(args)
        if not args.server:     # the server started for it: its settings, before anything starts
            own_server_settings(args)
        # Whatever can fail without a run is checked before one is created (and before a server
        # is started for it): Playwright and the browser's executable, a given server, the
        # browser's start and its WebGPU adapter.
        browser.check()
        if args.server:
            result["server"] = args.server.rstrip("/")
            _http("GET", result["server"] + "/healthz", timeout=CONNECT_S)
        browser.launch()
        adapter = browser.probe()
        progress(f"{browser.version} ({browser.path}), WebGPU adapter {adapter_name(adapter)}")
        if not args.server:
            proc = _start_server(args, result)
        code = _train(args, config, result, secret, browser, own_server=proc is not None)
    except (TrainError, BrowserError) as e:
        result["error"] = str(e)
        code = getattr(e, "code", EXIT_FAILED)
    except KeyboardInterrupt:   # outside the page's watch: tell the server if the run is live
        if _stop_by_socket(result, secret.get("token"), INTERRUPTED):
            result["status"] = "stopped"
        result["error"] = "interrupted"
        code = EXIT_INTERRUPTED
    except Exception as e:   # unforeseen: still one line and one JSON object, never a traceback
        result["error"] = unexpected(e)
        code = EXIT_FAILED
    finally:
        browser.close()
        if proc is not None:
            from andrea.cli.launch import stop_server
            stop_server(proc)
    report(args, result)
    return code


def _start_server(args, result: dict):
    from andrea.cli.launch import start_server
    from andrea.config import Settings
    from andrea.data_dir_lock import holder

    data_dir = args.data_dir or Settings().data_dir
    result["data_dir"] = str(Path(data_dir).resolve())
    running = holder(Path(data_dir))
    if running and running.get("url"):   # a second server on it would be refused: use that one
        result["server"] = running["url"].rstrip("/")
        progress(f"an andrea serve (pid {running.get('pid')}) serves {result['data_dir']}: "
                 f"training there, at {result['server']}")
        return None
    progress(f"starting a server (data in {result['data_dir']})")
    try:
        proc, url = start_server(Path(data_dir))
    except OSError as e:   # the data dir cannot be made or written, no interpreter to start
        raise TrainError(f"cannot start a server with data in {data_dir}: {e}") from None
    except RuntimeError as e:
        raise TrainError(str(e)) from None
    result["server"] = url
    return proc


def _train(args, config: dict, result: dict, secret: dict, browser: Chromium,
           own_server: bool = False) -> int:
    url = result["server"]
    if args.join or config.get("room"):   # a worker of a room run (room_join.py)
        return join_room(args, config, result, browser, _http)
    if args.resume:   # a new write token; the tab that trained it before is refused from now on
        resumed = _http("POST", f"{url}/api/runs/{args.resume}/resume", token=args.token)
        run = {"id": args.resume, "token": resumed["token"], "config": resumed["run"]["config"]}
        how = f"resumed from step {resumed['step']}"
    elif args.branch:
        config = _branch_config(url, args.branch, config)
        run = _http("POST", url + "/api/runs", config, CREATE_S, token=args.token)  # the parent's
        how = f"branched from {config['parent']['run']} at step {config['parent']['step']}"
    else:
        run = _http("POST", url + "/api/runs", config, CREATE_S)
        how = "new"
    result["run_id"] = run["id"]
    secret["token"] = run["token"]
    # Another browser or `andrea train --resume --token` takes the run over with it.
    result["resume_link"] = resume_link(url, run["id"], run["token"])
    progress(f"run {run['id']} on {url} ({how}): {run['config']['preset']}, "
             f"{run['config']['optimizer']}, {run['config']['steps']} steps")
    progress(f"resume link (holds the run's write token: share it only with who may change "
             f"the run): {result['resume_link']}")
    if own_server:   # the link is dead once this command exits: say what outlives it
        result["resume_hint"] = resume_hint(args, run["id"], result["data_dir"])
        progress(f"({result['resume_hint']})")
    try:
        code = _train_in_page(args, browser, url, run, result, secret)
    except (TrainError, BrowserError) as e:
        _settle_untrained(result, secret, str(e), resumed=bool(args.resume))
        raise
    except Exception as e:
        _settle_untrained(result, secret, unexpected(e), resumed=bool(args.resume))
        raise
    # Refused for good (the run was resumed elsewhere, another trainer holds it): its token has
    # nothing left to tell the server, and the run is someone else's now.
    if code == EXIT_FAILED and not secret.get("refused"):
        _settle_untrained(result, secret, result["error"], resumed=bool(args.resume))
    return code


def _train_in_page(args, browser: Chromium, url: str, run: dict, result: dict,
                   secret: dict) -> int:
    steps = run["config"]["steps"]
    unanswered = {"since": None}
    spikes = SpikeLog()

    def tick() -> str | None:   # progress; a server gone for SERVER_GONE_S ends the watch
        try:
            info = _http("GET", f"{url}/api/runs/{run['id']}", timeout=CONNECT_S)
        except TrainError as e:
            unanswered["since"] = unanswered["since"] or time.monotonic()
            return str(e) if time.monotonic() - unanswered["since"] > SERVER_GONE_S else None
        unanswered["since"] = None
        progress_bar(info.get("last_step") or 0, steps, info.get("last_loss"))
        spikes.poll(url, run["id"])
        return None

    losses = 0
    while True:
        try:
            page = browser.drive(url, run, args.timeout, tick)
        except KeyboardInterrupt:   # Ctrl-C again while the page was stopping
            page = drive_result(interrupted=True)
        if not page.get("lost") or page["interrupted"] or page["errors"]:
            break
        # The GPU device was lost (a driver reset, a crashed GPU process): the page kept every
        # record and stopped; the run goes on from its last checkpoint on a fresh device.
        losses += 1
        result["device_losses"] = losses
        if losses > MAX_DEVICE_LOSSES:
            page["errors"].append(f"{page['lost']} ({losses} times; gave up after "
                                  f"{MAX_DEVICE_LOSSES} resumes)")
            break
        run = _resume_after_loss(url, run, page["lost"], losses)
        secret["token"] = run["token"]
        result["resume_link"] = resume_link(url, run["id"], run["token"])
    secret["refused"] = page.get("refused")
    spikes.poll(url, run["id"], last=True)     # those of the run's last seconds too
    if (page["interrupted"] or page.get("timed_out")) and page["done"] is None:
        # The page could not stop it: the server is told directly.
        _stop_by_socket(result, run["token"], INTERRUPTED if page["interrupted"] else
                        f"stopped by the command's --timeout of {args.timeout:.0f} s")
        page["done"] = "stopped"
    try:
        metrics = _http("GET", f"{url}/api/runs/{run['id']}/metrics")
        info = _http("GET", f"{url}/api/runs/{run['id']}")
    except TrainError:
        if not page["interrupted"]:
            raise
        return page_exit(result, page, args.timeout)    # Ctrl-C stays 130 with the server away
    final = next((m for m in reversed(metrics) if m.get("loss") is not None), None)
    step_ms = sorted(m["step_ms"] for m in metrics if m.get("step_ms"))
    evals = [m for m in metrics if m.get("eval_loss") is not None]
    result.update({
        "status": info["status"], "steps": len(metrics),
        "final_loss": final["loss"] if final else None,
        "final_grad_norm": final["grad_norm"] if final else None,
        "median_step_ms": step_ms[len(step_ms) // 2] if step_ms else None,
        "adapter": info.get("adapter"),
        "readback": page["stats"]})
    if evals:   # (a room's is its global eval, said already)
        result.setdefault("final_eval_loss", evals[-1]["eval_loss"])
        # A toy task run's exact match on held-out problems at its last eval.
        result.setdefault("final_eval_acc", evals[-1].get("eval_acc"))
    return page_exit(result, page, args.timeout)


def _resume_after_loss(url: str, run: dict, lost: str, losses: int) -> dict:
    """The run resumed from its last checkpoint with a new write token, once the lost page's
    trainer socket is gone (the server refuses a resume while a trainer holds the run)."""
    info = _http("GET", f"{url}/api/runs/{run['id']}", timeout=CONNECT_S)
    step = (info.get("checkpoint") or {}).get("last_step")
    if not step:
        raise TrainError(f"{lost}; no checkpoint was saved before it, so the run cannot resume")
    progress(f"{lost}; resuming from the checkpoint of step {step} "
             f"({losses} of at most {MAX_DEVICE_LOSSES})")
    deadline = time.monotonic() + SERVER_GONE_S
    while True:
        try:
            resumed = http_client.request("POST", f"{url}/api/runs/{run['id']}/resume",
                                          token=run["token"])
            return {**run, "token": resumed["token"]}
        except http_client.ServerError as e:
            if e.status != 409 or time.monotonic() > deadline:
                raise TrainError(f"{lost}; the resume was refused: {e}") from None
        except http_client.Unreachable as e:
            raise TrainError(str(e)) from None
        time.sleep(0.25)


def resume_link(url: str, run_id: str, token: str) -> str:
    """The run page with the token in its fragment, which never reaches a server: the page
    keeps it as its creator's tab does (static/js/app/api.js)."""
    return f"{url}/runs/{run_id}#token={token}"


def resume_hint(args, run_id: str, data_dir: str) -> str:
    """How to resume later when the server is this command's own, which stops with it: a server
    on the data dir (its run page), or `andrea train --resume` (which starts one again)."""
    import shlex

    where = shlex.quote(data_dir)
    return (f"this server stops when andrea train exits: to resume later, run `andrea serve "
            f"--data-dir {where}` and open /runs/{run_id} there, or `andrea train --resume "
            f"{run_id} --data-dir {where}{' --gpu' if args.gpu else ''}`")


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
        step = newest_usable(listed, parent.get("last_step"))
        if step is None:
            raise TrainError(f"run {parent_id} has no checkpoint to branch from", EXIT_USAGE)
    config = {k: v for k, v in parent["config"].items()
              if k in run_config_model().model_fields and k != "parent"}
    return {**config, **changes, "parent": {"run": parent_id, "step": step}}


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

    A resumed run is marked `stopped` instead: nothing went wrong with the run itself, and its
    checkpoint is as good as before (its old token is revoked either way)."""
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
    """Tells the server the run's status as its training page would (server/telemetry/: hello
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
                why = reply.get("message") or f"the server answered {reply.get('type')!r}"
        except Exception as e:  # the server is gone too: nothing more to tell it
            why = str(e) or type(e).__name__
        if "another trainer" in why and time.monotonic() < deadline:
            time.sleep(0.25)
            continue
        progress(f"could not mark the run {status}: {why}")
        return False
