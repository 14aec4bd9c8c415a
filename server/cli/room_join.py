"""`andrea train --join RUN_ID --token JOIN_TOKEN` (or `--room JSON`, which creates a room run
and joins it): this machine's browser becomes one of a room run's workers (server/room/). The
room's page is opened from its join link and joins at once; the command follows the room's
global versions until the page ends, a line each (its version, the workers whose
pseudo-gradients made it, its global eval loss), then reports the room and its final eval
loss."""

from __future__ import annotations

import time

from andrea.cli import http_client
from andrea.cli.train_args import EXIT_USAGE, TrainError
from andrea.cli.train_output import page_exit, progress

CONNECT_S = 5
SERVER_GONE_S = 60      # a room's workers ride out a server restart: the command waits as long


def join_room(args, config: dict, result: dict, browser, http) -> int:
    """Joins (or creates and joins) the room and trains in it until the page ends. `http` is
    the command's JSON client (headless._http: refusals as TrainErrors)."""
    url = result["server"]
    if args.join:
        if not args.token:
            raise TrainError("--join needs the room's join token: --token or ANDREA_TOKEN (a "
                             "room's join link ends in #join=...)", EXIT_USAGE)
        info = http("GET", f"{url}/api/runs/{args.join}")
        if not info["config"].get("room"):
            raise TrainError(f"run {args.join} is not a room run: train it with --resume",
                             EXIT_USAGE)
        run = {"id": args.join, "config": info["config"], "join_token": args.token}
    else:
        created = http("POST", url + "/api/runs", config)
        run = {"id": created["id"], "config": created["config"],
               "join_token": created["room"]["join_token"]}
    result["run_id"] = run["id"]
    result["join_link"] = f"{url}/runs/{run['id']}#join={run['join_token']}"
    room_cfg = run["config"]["room"]
    progress(f"room run {run['id']} on {url}: {run['config']['preset']}, "
             f"{run['config']['steps']} inner steps in rounds of {room_cfg['inner_steps']}, "
             f"{room_cfg['codec']} pseudo-gradients")
    progress(f"join link (anyone who has it may train in the room): {result['join_link']}")
    unanswered = {"since": None}
    room_url = f"{url}/api/runs/{run['id']}/room"
    lines = VersionLines()

    def tick() -> str | None:
        try:
            room = http_client.request("GET", room_url, timeout=CONNECT_S)
        except (http_client.ServerError, http_client.Unreachable) as e:
            unanswered["since"] = unanswered["since"] or time.monotonic()
            return str(e) if time.monotonic() - unanswered["since"] > SERVER_GONE_S else None
        unanswered["since"] = None
        lines.show(room)
        return None

    page = browser.drive(url, run, args.timeout, tick, join_token=run["join_token"])
    room = http("GET", room_url)
    lines.show(room, last=True)
    mine = [w for w in room["workers"] if w["deltas"]]
    final = final_eval(room)
    result.update({"status": room["finished"] and "finished" or "running",
                   "version": room["version"], "rounds": room["rounds"],
                   "workers": len(room["workers"]), "sent_bytes": sum(w["bytes"] for w in mine),
                   "final_eval_loss": final and final["median"],
                   "final_eval_version": final and final["version"],
                   "readback": page["stats"]})
    return page_exit(result, page, args.timeout, "worker")


def final_eval(room: dict) -> dict | None:
    """The newest version's global eval loss (the room's evals: the median of its workers'
    measures), or None before any."""
    return max(room["evals"], key=lambda e: e["version"], default=None)


def version_line(room: dict, version: int, evals: dict) -> str:
    """Version `version` in a line: "version 3/6: 4 workers, global eval loss 5.1234" (the
    workers whose pseudo-gradients made it: its round's; version 0 is the server's init)."""
    made = next((c for c in room["closed"] if c["version"] == version), None)
    if version == 0:
        who = "the seeded init"
    elif made is None:
        who = "workers unknown"
    else:
        n = len(made["workers"])
        who = f"{n} worker{'s' if n != 1 else ''}" + (
            f" (rejected: {made['rejected']})" if made.get("rejected") else "")
    e = evals.get(version)
    loss = "-" if e is None else f"{e['median']:.4f}"
    return f"version {version}/{room['rounds']}: {who}, global eval loss {loss}"


class VersionLines:
    """Prints each global version once, when its eval loss is in (the workers measure it as
    they take it), or once a newer version is made without it, or at the end (`last`)."""

    def __init__(self):
        self.next = 0

    def show(self, room: dict, last: bool = False) -> None:
        evals = {e["version"]: e for e in room["evals"]}
        while self.next <= room["version"]:
            v = self.next
            if v not in evals and not last and v + 1 >= room["version"] and \
                    not (room["finished"] and v < room["version"]):
                return          # its eval loss may be on its way
            progress(version_line(room, v, evals))
            self.next += 1
