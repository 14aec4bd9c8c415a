""""Did the room help?": the lone tab a room run is compared with on its page. That is the
newest single run on this server (no room, no parent) that trains what one of the room's
workers trains: the same model shape, batch and context, optimizer and learning rate, and
one that started (a run never started has nothing to compare). Read from the runs' rows alone
(the runs list's query), never their records. When there is none, `config` is what
POST /api/runs takes to make one: the room run's config without its room, its steps (each
worker's inner steps) and seed (the same version 0) kept. Nothing here is HTTP's."""

from __future__ import annotations

from andrea.model import SHAPE_FIELDS
from andrea.run_config import RunConfig, StoredRunConfig

# The newest runs looked at, at most: the lookup reads this many rows whatever the server
# holds (a lone run older than the newest 500 is not found; the page offers to train one).
LONE_SCAN = 500
# What one of the room's workers trains (on the same text), and a single run must train the
# same to compare.
SAME = (*SHAPE_FIELDS, "seq_len", "batch_size", "optimizer", "lr", "corpus_hash")


def trains_like(config: StoredRunConfig) -> tuple:
    """The fields a lone tab shares with a room's worker."""
    return tuple(getattr(config, k) for k in SAME)


def is_lone_tab(run: dict, key: tuple, stale_before: float) -> bool:
    """`run` (a stored row) is a single run that trains like `key` and started, or may still
    start: one made a moment ago (by the room page's button: its tab starts it now) is the one
    to show; one never started (`abandoned`, or `created` before `stale_before` with no step:
    info.read_run's rule) has nothing to show."""
    cfg = run["config"]
    if cfg.room is not None or cfg.parent is not None:
        return False
    if run.get("last_step") is None and (
            run["status"] == "abandoned"
            or (run["status"] == "created" and run["updated_at"] < stale_before)):
        return False
    return trains_like(cfg) == key


def lone_run(room_run: dict, rows: list[dict], stale_before: float) -> dict:
    """The lone tab of `room_run` among `rows` (the newest runs, newest first): {"run": its id
    or None, "name", "status", "why": in words, "config": a single run's config like the room's
    workers' (what POST /api/runs takes to make one)}."""
    cfg = room_run["config"]
    key = trains_like(cfg)
    found = next((r for r in rows if r["id"] != room_run["id"]
                  and is_lone_tab(r, key, stale_before)), None)
    what = (f"{cfg.n_layer} layers x {cfg.n_embd} wide, {cfg.n_head} heads, ffn "
            f"{cfg.ffn_dim}, vocab {cfg.vocab_size}, batch {cfg.batch_size} x "
            f"{cfg.seq_len} tokens, {cfg.optimizer} at lr {cfg.lr:g}")
    why = (f"no single run of the same shape ({what}) among the newest {LONE_SCAN} runs on "
           "this server (one that never started is left out)" if found is None
           else f"the newest single run of the same shape ({what})")
    return {"run": found and found["id"], "name": found and found["name"],
            "status": found and found["status"], "why": why, "config": lone_config(room_run)}


def lone_config(room_run: dict) -> dict:
    """The config POST /api/runs takes for a lone tab of this room run: its own, less its room
    (and what the server adds: corpus_hash), as a single run of the same steps and seed."""
    return room_run["config"].model_dump(
        mode="json", include=set(RunConfig.model_fields) - {"room", "parent"})
