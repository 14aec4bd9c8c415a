"""`andrea train --join RUN_ID --token JOIN_TOKEN` (or `--room JSON`, which creates a room run
and joins it): this machine's browser becomes one of a room run's workers (server/room/). The
room's page is opened from its join link and joins at once; the command follows the room's
global versions until the page ends, then reports the room."""

from __future__ import annotations

import time

from andrea.cli import http_client
from andrea.cli.train_args import EXIT_USAGE, TrainError
from andrea.cli.train_output import page_exit, progress, progress_bar

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

    def tick() -> str | None:
        try:
            room = http_client.request("GET", room_url, timeout=CONNECT_S)
        except (http_client.ServerError, http_client.Unreachable) as e:
            unanswered["since"] = unanswered["since"] or time.monotonic()
            return str(e) if time.monotonic() - unanswered["since"] > SERVER_GONE_S else None
        unanswered["since"] = None
        progress_bar(room["version"] or 0, room["rounds"], None)
        return None

    page = browser.drive(url, run, args.timeout, tick, join_token=run["join_token"])
    room = http("GET", room_url)
    mine = [w for w in room["workers"] if w["deltas"]]
    result.update({"status": room["finished"] and "finished" or "running",
                   "version": room["version"], "rounds": room["rounds"],
                   "workers": len(room["workers"]), "sent_bytes": sum(w["bytes"] for w in mine),
                   "readback": page["stats"]})
    return page_exit(result, page, args.timeout, "worker")
