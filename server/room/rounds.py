"""A room's durable state and its rounds: who joined, which global version is being trained,
the pseudo-gradients received for it, and the round's close (clip, average, outer step, the next
version committed). Blocking file I/O: the routes call it in a thread, holding the run's lock
(Fanout.run_lock, across processes too), so every change here is one writer's.

  <run_dir>/room/state.json           the room now (atomic rewrite per change: the commit)
  <run_dir>/room/deltas/<v>/<w>.bin   round v's pseudo-gradients as sent, one per worker
  <run_dir>/room/rounds.jsonl         one line per closed round: who sent what, norms, clips
  <run_dir>/room/reports.jsonl        workers' inner losses, and eval losses of a version
  <run_dir>/checkpoints/<v>           global version v: W, then the outer momentum (f32 each)

A round's pseudo-gradients wait on disk until it closes, so memory holds one running sum and one
decoded delta, never N, and a server that restarts mid-round loses none. Each is clipped to
clip_multiple x the median of that round's norms before the mean (round 0 included: no previous
round is needed), so one worker's 100x delta moves the model no more than a typical one; a
pseudo-gradient of the wrong size or with a value that is not finite is refused at upload.

Closing a round v: W and momentum of version v read, the clipped mean applied by the outer
optimizer (outer.py), checkpoint v+1 committed, the round's line appended, then state.json says
v+1 and the round's deltas are removed. A crash after the commit and before state.json is redone at
the next load from the same files (the same bytes: the commit is a no-op; the round's line may
be written twice, and is read once), so a restart resumes at the last closed round with nothing
lost."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from functools import cached_property
from pathlib import Path

import numpy as np

from andrea.checkpoints import CheckpointStore
from andrea.durable import append_line, fsync_dir, read_lines, write_atomic
from andrea.paths import room_dir
from andrea.room.codec import DeltaRefused, decode, payload_bytes
from andrea.room.outer import nesterov_step, norm64
from andrea.room.shards import rounds_total
from andrea.web.auth import new_token, token_hash, token_matches

OPTIMIZER = "room_outer"     # the checkpoints' optimizer name: global W and outer momentum


class RoomError(Exception):
    """A request the room refuses, with the HTTP status that says why; `closed`: the round
    closed all the same (a refused pseudo-gradient was the last answer it waited for)."""

    def __init__(self, status: int, message: str, closed: bool = False):
        super().__init__(message)
        self.status, self.closed = status, closed


def sections(numel: int) -> list[dict]:
    return [{"name": "W", "bytes": 4 * numel}, {"name": "momentum", "bytes": 4 * numel}]


def param_mask(layout: dict) -> np.ndarray:
    """True where the flat buffer holds a parameter (False: alignment padding, kept zero)."""
    mask = np.zeros(layout["total_numel"], bool)
    for p in layout["params"]:
        mask[p["offset"]:p["offset"] + p["numel"]] = True
    return mask


class Room:
    """One room run's state on disk. `config` is the stored run config (with `room`), `layout`
    its parameter table."""

    def __init__(self, data_dir: Path, ckpts: CheckpointStore, run_id: str, config: dict,
                 layout: dict):
        self.ckpts, self.run_id, self.config = ckpts, run_id, config
        self.room = config["room"]
        self.numel = layout["total_numel"]
        self.layout = layout
        self.dir = room_dir(data_dir, run_id)
        self.rounds = rounds_total(config)

    @cached_property
    def mask(self) -> np.ndarray:
        """Where the flat buffer holds a parameter (param_mask): made once per Room."""
        return param_mask(self.layout)

    # ---- state ---------------------------------------------------------------------------
    def _path(self) -> Path:
        return self.dir / "state.json"

    def create(self, join_token: str) -> None:
        """The room of a new run: no version yet (the first worker publishes version 0)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._save({"version": None, "join_token_sha256": token_hash(join_token),
                    "workers": {}, "open": _open_round(), "finished": False})

    def read(self) -> dict:
        """The state as committed (a close in progress under the lock is not in it yet)."""
        try:
            return json.loads(self._path().read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RoomError(404, f"run {self.run_id} is not a room run") from None

    def load(self) -> dict:
        """The state for a change, under the run's lock: first a close that a crash interrupted
        is finished (see the docstring). Only under the lock: without it, a close in progress
        would look interrupted."""
        st = self.read()
        v = st["version"]
        if v is not None and not st["finished"] and st["open"]["received"] \
                and self.ckpts.get(self.run_id, v + 1) is not None:
            st = self._close(st, time.time())
        return st

    def _save(self, st: dict) -> None:
        write_atomic(self._path(), json.dumps(st, indent=1).encode())

    def _append(self, name: str, line: dict) -> None:
        append_line(self.dir / name, line)

    # ---- workers -------------------------------------------------------------------------
    def join(self, join_token: str, now: float, worker_token: str | None = None) -> dict:
        """A new worker: its id, data slot and token (shown once), and the version to train
        (None: none yet; train from the run's seed and publish version 0). With the token of a
        worker still in the room (its tab reloaded or crashed), that worker again: the same id
        and slot, from the current version (one it already sent for this round is kept; a
        second is refused as a duplicate)."""
        st = self.load()
        if not token_matches(st["join_token_sha256"], join_token):
            raise RoomError(403, "wrong or missing join token: use the room's join link")
        if st["finished"]:
            raise RoomError(409, "this room run is finished: there is nothing left to train")
        if worker_token:
            for wid, w in _active(st).items():
                if token_matches(w["token_sha256"], worker_token):
                    return {"worker": int(wid), "slot": w["slot"], "token": worker_token,
                            "version": st["version"], "rejoined": True}
        if len(st["workers"]) >= self.max_joins():
            raise RoomError(409, f"this room has had {len(st['workers'])} joins, its most "
                                 "(max_workers per round): rejoin with your worker token")
        active = _active(st)
        taken = {w["slot"] for w in active.values()}
        free = [s for s in range(self.room["max_workers"]) if s not in taken]
        if not free:
            raise RoomError(409, f"the room is full: {self.room['max_workers']} workers train "
                                 "it now (its max_workers)")
        wid = str(len(st["workers"]))
        token = new_token()
        st["workers"][wid] = {"slot": free[0], "token_sha256": token_hash(token), "joined": now,
                              "joined_version": st["version"], "left": None, "why": None,
                              "bytes": 0, "deltas": 0, "stale": 0, "refused": 0, "missed": 0}
        self._save(st)
        return {"worker": int(wid), "slot": free[0], "token": token, "version": st["version"]}

    def worker_of(self, st: dict, token: str) -> str:
        """The id of the active worker whose token this is; 403 otherwise."""
        for wid, w in st["workers"].items():
            if token and token_matches(w["token_sha256"], token):
                if w["left"] is not None:
                    raise RoomError(403, f"worker {wid} left the room ({w['why']}): join again")
                return wid
        raise RoomError(403, "wrong or missing worker token: join the room first")

    def leave(self, token: str, now: float, why: str = "left") -> dict:
        st = self.load()
        wid = self.worker_of(st, token)
        st["workers"][wid].update(left=now, why=why)
        open_ = st["open"]
        open_["received"].pop(wid, None)     # a worker that leaves is not in the round
        open_["refused"].pop(wid, None)
        # The deadline counts from the round's first pseudo-gradient still in it.
        open_["first_at"] = min((r["at"] for r in open_["received"].values()), default=None)
        self._save(st)                       # first: a stop after it leaves a stray file only
        self._discard_delta(st["version"], wid)
        return st

    # ---- versions ------------------------------------------------------------------------
    def publish_init(self, token: str, weights: bytes, now: float) -> dict:
        """Version 0 from a worker's seeded initialisation; the first one wins (409 after)."""
        st = self.load()
        self.worker_of(st, token)
        if st["version"] is not None:
            raise RoomError(409, f"the room already has version {st['version']}: download it")
        if len(weights) != 4 * self.numel:
            raise RoomError(400, f"version 0 of this model is {4 * self.numel} bytes of f32 "
                                 f"weights, not {len(weights)}")
        try:
            w = decode(weights, "f32", self.numel)
        except DeltaRefused as e:      # not finite
            raise RoomError(422, f"version 0 refused: {e}") from None
        self._commit(0, w, np.zeros(self.numel, np.float32))
        st["version"] = 0
        self._save(st)
        return st

    def open_weights(self, version: int):
        """(bytes, the verified file open at version `version`'s weights): for streaming."""
        st = self.read()
        if st["version"] is None or version > st["version"]:
            raise RoomError(404, f"the room has no version {version} yet "
                                 f"(newest: {st['version']})")
        if self.ckpts.get(self.run_id, version) is None:
            raise RoomError(410, f"version {version} is no longer kept: download "
                                 f"{st['version']}")
        return self.ckpts.open_section(self.run_id, version, 0)

    def _commit(self, version: int, weights: np.ndarray, momentum: np.ndarray) -> None:
        self.ckpts.write(self.run_id, version, [weights.astype("<f4").tobytes(),
                                                momentum.astype("<f4").tobytes()],
                         OPTIMIZER, sections(self.numel))

    # ---- pseudo-gradients ----------------------------------------------------------------
    def expected_bytes(self) -> int:
        return payload_bytes(self.room["codec"], self.numel)

    def accept(self, token: str, version: int, body_path: Path, now: float) -> dict:
        """Worker's pseudo-gradient for `version` (the file `body_path`, moved into the round
        when taken). Returns {"closed": the round closed now, "version": the current one};
        RoomError 409 for a stale version or a second one, 422 for a refused body."""
        st = self.load()
        wid = self.worker_of(st, token)
        worker, open_ = st["workers"][wid], st["open"]
        if st["finished"]:
            raise RoomError(409, "this room run is finished: its last version is the model")
        if st["version"] is None or version != st["version"]:
            worker["stale"] += 1
            open_["stale"] += 1
            self._save(st)
            raise RoomError(409, f"version {version} is not the one being trained (now "
                                 f"{st['version']}): this pseudo-gradient is dropped; download "
                                 "the current version and go on")
        if wid in open_["received"]:
            raise RoomError(409, f"worker {wid} already sent its pseudo-gradient for version "
                                 f"{version}")
        try:
            delta = decode(body_path.read_bytes(), self.room["codec"], self.numel)
        except DeltaRefused as e:
            worker["refused"] += 1
            open_["refused"][wid] = str(e)
            closed = self._maybe_close(st, now)
            raise RoomError(422, f"pseudo-gradient refused: {e}; the round goes on without "
                                 f"it{' (and it closed)' if closed else ''}; a good one may "
                                 "still be sent", closed) from None
        open_["refused"].pop(wid, None)      # refused before: this one counts
        delta[~self.mask] = 0
        nbytes = body_path.stat().st_size
        folder = self.dir / "deltas" / str(version)
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(body_path, folder / f"{wid}.bin")
        fsync_dir(folder)
        open_["received"][wid] = {"bytes": nbytes, "norm": norm64(delta), "at": now}
        if open_["first_at"] is None:
            open_["first_at"] = now
        worker.update(bytes=worker["bytes"] + nbytes, deltas=worker["deltas"] + 1, missed=0)
        return {"closed": self._maybe_close(st, now), "version": version}

    def _discard_delta(self, version: int | None, wid: str) -> None:
        if version is not None:
            (self.dir / "deltas" / str(version) / f"{wid}.bin").unlink(missing_ok=True)

    # ---- closing -------------------------------------------------------------------------
    def due(self, st: dict, now: float) -> bool:
        """The open round can close: every active worker answered (and one sent a delta), or
        the deadline after its first delta passed with a quorum."""
        open_ = st["open"]
        got = len(open_["received"])
        if st["finished"] or got == 0:
            return False
        answered = set(open_["received"]) | set(open_["refused"])
        if set(_active(st)) <= answered:
            return True
        return (got >= self.room["quorum"]
                and now >= open_["first_at"] + self.room["round_deadline_s"])

    def _maybe_close(self, st: dict, now: float) -> bool:
        self._save(st)          # what was taken is committed first: a close redone has it
        if self.due(st, now):
            self._close(st, now)
            return True
        return False

    def close_if_due(self, now: float) -> dict | None:
        """The sweep's call: closes the open round when due; its line, or None. A round that
        waits past missed_rounds deadlines after its first pseudo-gradient (its quorum out of
        reach: the others' tabs gone) drops the workers that sent nothing: they would count as
        missed at a close that never comes, holding their slots for good."""
        st = self.load()
        open_ = st["open"]
        if not self.due(st, now) and open_["first_at"] is not None and not st["finished"] \
                and now >= open_["first_at"] + self.room["missed_rounds"] * \
                self.room["round_deadline_s"]:
            for wid, worker in _active(st).items():
                if wid not in open_["received"] and wid not in open_["refused"]:
                    worker.update(left=now, why=f"sent nothing for {self.room['missed_rounds']}"
                                                " round deadlines")
            self._save(st)
        if not self.due(st, now):
            return None
        return self._close(st, now)["last_round"]

    def recover(self) -> dict:
        """At start, under the run's lock: a close a stop cut short is finished (load), and the
        pseudo-gradients of rounds closed before a stop could remove them are removed."""
        st = self.load()
        deltas = self.dir / "deltas"
        if deltas.is_dir():
            for folder in deltas.iterdir():
                if folder.name != str(st["version"]):
                    shutil.rmtree(folder, ignore_errors=True)
        return st

    def max_joins(self) -> int:
        """Joins over the room's life (a worker's log entry each): max_workers per round and
        one round more; a tab that comes back rejoins with its worker token instead."""
        return self.room["max_workers"] * (self.rounds + 1)

    def _close(self, st: dict, now: float) -> dict:
        v, open_ = st["version"], st["open"]
        ids = sorted(open_["received"], key=int)
        norms = np.array([open_["received"][w]["norm"] for w in ids])
        limit = self.room["clip_multiple"] * float(np.median(norms))
        _, f = self.ckpts.open_verified(self.run_id, v)
        with f:
            weights = np.frombuffer(f.read(4 * self.numel), "<f4").astype(np.float32)
            momentum = np.frombuffer(f.read(4 * self.numel), "<f4").astype(np.float32)
        total = np.zeros(self.numel, np.float32)      # the one running sum
        scales = {}
        for w in ids:
            delta = decode((self.dir / "deltas" / str(v) / f"{w}.bin").read_bytes(),
                           self.room["codec"], self.numel)
            delta[~self.mask] = 0
            norm = open_["received"][w]["norm"]
            scales[w] = min(1.0, limit / norm) if norm > 0 else 1.0
            if scales[w] < 1.0:
                delta *= np.float32(scales[w])
            total += delta
        total /= np.float32(len(ids))
        nesterov_step(weights, momentum, total, self.room["outer_lr"],
                      self.room["outer_momentum"], first=(v == 0))
        self._commit(v + 1, weights, momentum)
        line = {"round": v, "version": v + 1, "closed_at": now,
                "opened_at": open_["opened_at"], "median_norm": float(np.median(norms)),
                "clip_limit": limit, "outer_grad_norm": norm64(total),
                "workers": {w: {**open_["received"][w], "clip_scale": scales[w]} for w in ids},
                "refused": open_["refused"], "stale": open_["stale"]}
        for wid, worker in _active(st).items():      # who sent nothing this round
            if wid not in open_["received"] and wid not in open_["refused"]:
                worker["missed"] += 1
                if worker["missed"] >= self.room["missed_rounds"]:
                    worker.update(left=now, why=f"sent nothing for {worker['missed']} rounds")
        st.update(version=v + 1, open=_open_round(now), last_round=line,
                  finished=v + 1 >= self.rounds)
        self._append("rounds.jsonl", line)   # before the state: a redo appends it again
        self._save(st)
        shutil.rmtree(self.dir / "deltas" / str(v), ignore_errors=True)
        return st

    # ---- reports and reading -------------------------------------------------------------
    def report(self, token: str, version: int, losses: list[float],
               eval_loss: float | None, now: float) -> None:
        """A worker's inner losses of the round that trained `version`, and the eval loss of
        `version`'s global weights when it measured one."""
        st = self.load()
        wid = self.worker_of(st, token)
        if st["version"] is None or not 0 <= version <= st["version"]:
            raise RoomError(409, f"no version {version} has been trained here")
        if len(losses) > self.room["inner_steps"]:
            raise RoomError(422, f"a round has {self.room['inner_steps']} inner steps, not "
                                 f"{len(losses)} losses")
        if not all(math.isfinite(x) for x in losses) or \
                (eval_loss is not None and not math.isfinite(eval_loss)):
            raise RoomError(422, "losses must be finite numbers")
        worker = st["workers"][wid]
        sent = worker.get("reports", 0)
        if sent >= 2 * (st["version"] + 1):     # a round's report, and a retry of it
            raise RoomError(409, f"worker {wid} has sent {sent} reports for {st['version'] + 1}"
                                 " versions: one a round")
        worker["reports"] = sent + 1
        self._save(st)
        self._append("reports.jsonl", {"worker": int(wid), "version": version, "at": now,
                                       "losses": losses, "eval_loss": eval_loss})

    def closed_rounds(self) -> list[dict]:
        """rounds.jsonl's lines, one per round (a close redone after a crash wrote its line
        twice: the last one counts)."""
        return list({line["round"]: line for line in self._lines("rounds.jsonl")}.values())

    def reports(self) -> list[dict]:
        return self._lines("reports.jsonl")

    def _lines(self, name: str) -> list[dict]:
        return read_lines(self.dir / name)


def _open_round(now: float | None = None) -> dict:
    return {"opened_at": now, "first_at": None, "received": {}, "refused": {}, "stale": 0}


def _active(st: dict) -> dict:
    return {wid: w for wid, w in st["workers"].items() if w["left"] is None}
