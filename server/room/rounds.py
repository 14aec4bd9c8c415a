"""A room's durable state and its rounds: who joined, which global version is being trained,
the pseudo-gradients received for it, and the reports. Blocking file I/O: services/rooms.py
calls it in a thread, holding the run's lock (Fanout.run_lock, across processes too), so every
change here is one writer's. The close's math is aggregate.py's and its streamed file work
close.py's.

  <run_dir>/room/state.json           the room now (atomic rewrite per change: the commit)
  <run_dir>/room/deltas/<v>/<w>.bin   round v's pseudo-gradients as sent, one per worker
  <run_dir>/room/rounds.jsonl         one line per closed round: who sent what, norms, clips
  <run_dir>/room/reports.jsonl        workers' inner losses, eval losses of a version, and
                                      how long each spent on it (timings)
  <run_dir>/room/progress.json        each worker's inner step now (for the room's page; not
                                      durable: a crash loses only who was at which step)
  <run_dir>/checkpoints/<v>           global version v: W, then the outer momentum (f32 each)

What a room trusts nobody with:
  - version 0 is made here from the run's seed (init.py), never uploaded;
  - a pseudo-gradient is refused (INVALID) unless every value is finite and within what H
    AdamW steps at the run's learning rate can move an element (bounds.py), whatever the others
    sent;
  - one client address is one worker (workers_per_address), joins are bounded per address, a
    worker that sends nothing within a round deadline of joining leaves, and the run's owner
    may remove a worker for good (its token and its address);
  - reports are one per worker and version, bounded, and in the run's storage budget.

A round's pseudo-gradients wait on disk until it closes, so a server that restarts mid-round
loses none. Closing a round v: version v + 1 committed (close.py), the round's line appended,
then state.json says v + 1 and the round's deltas are removed. A crash after the commit and
before state.json is redone at the next load from the same files (the same bytes: the commit is
a no-op; the round's line may be written twice, and is read once)."""

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
from andrea.data.shards import rounds_total
from andrea.durable import TEMP_SUFFIX, append_line, fsync_dir, read_lines, write_atomic
from andrea.errors import (
    CONFLICT,
    DISK_FULL,
    GONE,
    INVALID,
    NOT_ALLOWED,
    NOT_FOUND,
    TOO_OFTEN,
    Refused,
)
from andrea.paths import room_dir
from andrea.room.aggregate import HISTORY_NORMS
from andrea.room.bounds import delta_bound
from andrea.room.close import OPTIMIZER, close_round, commit_arrays, residual_of, sections
from andrea.room.codec import DeltaRefused, chunks, payload_bytes
from andrea.run_config import RunConfig, StoredRunConfig
from andrea.write_tokens import new_token, token_hash, token_matches

__all__ = ["OPTIMIZER", "Room", "RoomError", "param_mask", "sections"]
REMOVED = "removed by the run's owner"
WAIT_BACKOFF_S = (10, 20, 40, 80, 160, 300)    # a close waiting for disk tries again after


class RoomError(Refused):
    """A request the room refuses: its kind (errors.Refusal) and why."""


def param_mask(layout: dict, decay_only: bool = False) -> np.ndarray:
    """True where the flat buffer holds a parameter (False: alignment padding, kept zero);
    `decay_only`: only the decayed ones (the matrices)."""
    mask = np.zeros(layout["total_numel"], bool)
    for p in layout["params"]:
        if p["decay"] or not decay_only:
            mask[p["offset"]:p["offset"] + p["numel"]] = True
    return mask


class Room:
    """One room run's state on disk. `config` is the stored run config (with `room`), `layout`
    its parameter table."""

    def __init__(self, data_dir: Path, ckpts: CheckpointStore, run_id: str,
                 config: StoredRunConfig, layout: dict):
        self.ckpts, self.run_id, self.config = ckpts, run_id, config
        self.room = config.room
        self.numel = layout["total_numel"]
        self.layout = layout
        self.dir = room_dir(data_dir, run_id)
        self.rounds = rounds_total(config)

    @cached_property
    def mask(self) -> np.ndarray:
        return param_mask(self.layout)

    @cached_property
    def decay(self) -> np.ndarray:
        return param_mask(self.layout, decay_only=True)

    # ---- state ---------------------------------------------------------------------------
    def _path(self) -> Path:
        return self.dir / "state.json"

    def create(self, join_token: str, weights: np.ndarray, now: float) -> None:
        """The room of a new run, at version 0: `weights`, the run's seeded initialisation
        (init.py), with zero momentum."""
        self.dir.mkdir(parents=True, exist_ok=True)
        top_decay, top = commit_arrays(self.ckpts, self.run_id, 0, weights, self.decay)
        self._save({"version": 0, "join_token_sha256": token_hash(join_token),
                    "workers": {}, "open": _open_round(now), "finished": False,
                    "max_abs_decay": top_decay, "max_abs": top, "norm_history": [], "evals": {},
                    "report_bytes": 0})

    def read(self) -> dict:
        """The state as committed (a close in progress under the lock is not in it yet)."""
        try:
            return json.loads(self._path().read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RoomError(NOT_FOUND, f"run {self.run_id} is not a room run") from None

    def load(self) -> dict:
        """The state for a change, under the run's lock: first a close that a crash interrupted
        is finished (see the docstring). Only under the lock: without it, a close in progress
        would look interrupted."""
        st = self.read()
        v = st["version"]
        if not st["finished"] and st["open"]["received"] \
                and self.ckpts.get(self.run_id, v + 1) is not None:
            st = self._close(st, time.time())
        return st

    def _save(self, st: dict) -> None:
        write_atomic(self._path(), json.dumps(st, indent=1).encode())

    def _append(self, name: str, line: dict) -> None:
        append_line(self.dir / name, line)

    # ---- workers -------------------------------------------------------------------------
    def join(self, join_token: str, now: float, address: str,
             worker_token: str | None = None) -> dict:
        """A new worker: its id, data slot and token (shown once), and the version to train.
        With the token of a worker that was in the room (its tab reloaded, crashed or left),
        that worker again, from the current version (one it already sent for this round is
        kept; a second is refused as a duplicate). One client address is one worker unless
        the room allows more (workers_per_address); new joins are bounded per address."""
        st = self.load()
        if not token_matches(st["join_token_sha256"], join_token):
            raise RoomError(NOT_ALLOWED, "wrong or missing join token: use the room's join link")
        if st["finished"]:
            raise RoomError(CONFLICT, "this room run is finished: there is nothing left to train")
        workers, per = st["workers"], self.room.workers_per_address
        if any(w.get("removed") and w.get("address") == address for w in workers.values()):
            raise RoomError(NOT_ALLOWED, f"a worker of this address was {REMOVED}: it may not join "
                                         "again")
        again = worker_token and next((wid for wid, w in workers.items()
                                       if token_matches(w["token_sha256"], worker_token)), None)
        if again is not None and workers[again]["left"] is None:
            w = workers[again]
            return {"worker": int(again), "slot": w["slot"], "token": worker_token,
                    "version": st["version"], "rejoined": True}
        mine = [w for w in _active(st).values() if w.get("address") == address]
        if len(mine) >= per:
            raise RoomError(CONFLICT, f"this address already trains {len(mine)} worker(s) of "
                                      f"this room, its most (workers_per_address {per}): one "
                                      "participant is one worker; the room's creator can allow "
                                      "more")
        slot = self._free_slot(st)
        if again is not None:        # a worker that left comes back: the same id and token
            w = workers[again]
            w.update(slot=slot, left=None, why=None, missed=0, rejoined=now,
                     rejoined_version=st["version"], address=address)
            self._save(st)
            return {"worker": int(again), "slot": slot, "token": worker_token,
                    "version": st["version"], "rejoined": True}
        joins = [w["joined"] for w in workers.values() if w.get("address") == address]
        if len(joins) >= self.joins_per_address():
            raise RoomError(CONFLICT, f"this address has joined this room {len(joins)} times, its "
                                      "most: rejoin with your worker token")
        recent = sum(1 for t in joins if now - t < self.room.round_deadline_s)
        if recent >= per + 2:
            raise RoomError(TOO_OFTEN, f"this address joined {recent} times in the last "
                                       f"{self.room.round_deadline_s:g} s: wait, or rejoin with "
                                       "your worker token")
        wid = str(len(workers))
        token = new_token()
        workers[wid] = {"slot": slot, "token_sha256": token_hash(token), "joined": now,
                        "joined_version": st["version"], "left": None, "why": None,
                        "address": address, "bytes": 0, "deltas": 0, "stale": 0, "refused": 0,
                        "missed": 0, "reported": []}
        self._save(st)
        return {"worker": int(wid), "slot": slot, "token": token, "version": st["version"]}

    def _free_slot(self, st: dict) -> int:
        taken = {w["slot"] for w in _active(st).values()}
        free = [s for s in range(self.room.max_workers) if s not in taken]
        if not free:
            raise RoomError(CONFLICT, f"the room is full: {self.room.max_workers} workers train "
                                      "it now (its max_workers)")
        return free[0]

    def joins_per_address(self) -> int:
        """New workers one address may add over the room's life: workers_per_address a round
        and one round more (a tab that comes back rejoins with its worker token instead)."""
        return self.room.workers_per_address * (self.rounds + 1)

    def worker_of(self, st: dict, token: str) -> str:
        """The id of the active worker whose token this is; NOT_ALLOWED otherwise."""
        for wid, w in st["workers"].items():
            if token and token_matches(w["token_sha256"], token):
                if w["left"] is not None:
                    again = "" if w.get("removed") else ": join again"
                    raise RoomError(NOT_ALLOWED, f"worker {wid} left the room ({w['why']}){again}")
                return wid
        raise RoomError(NOT_ALLOWED, "wrong or missing worker token: join the room first")

    def leave(self, token: str, now: float, why: str = "left") -> dict:
        st = self.load()
        return self._drop(st, self.worker_of(st, token), now, why)

    def remove(self, worker: int, now: float) -> dict:
        """The run's owner (or the operator) removes worker `worker`: out of the round, and
        neither its token nor its address may join again."""
        st = self.load()
        wid = str(worker)
        if wid not in st["workers"]:
            raise RoomError(NOT_FOUND, f"the room has no worker {worker}")
        st["workers"][wid]["removed"] = True
        if st["workers"][wid]["left"] is not None:
            st["workers"][wid]["why"] = REMOVED
            self._save(st)
            return st
        return self._drop(st, wid, now, REMOVED)

    def _drop(self, st: dict, wid: str, now: float, why: str) -> dict:
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
    def open_weights(self, version: int):
        """(bytes, the verified file open at version `version`'s weights): for streaming."""
        st = self.read()
        if version > st["version"]:
            raise RoomError(NOT_FOUND, f"the room has no version {version} yet "
                                       f"(newest: {st['version']})")
        if self.ckpts.get(self.run_id, version) is None:
            raise RoomError(GONE, f"version {version} is no longer kept: download "
                                  f"{st['version']}")
        return self.ckpts.open_section(self.run_id, version, 0)

    def close_bytes(self) -> int:
        """What a close writes: the next version's checkpoint (W and momentum, f32 each), and
        in an int8 room its update and the residual it carries."""
        update = payload_bytes("int8", self.numel) + 4 * self.numel   # and its residual
        return 8 * self.numel + (update if self.sends_updates() else 0)

    # ---- versions as updates (an int8 room: close.py Update) ------------------------------
    def sends_updates(self) -> bool:
        return self.room.codec == "int8"

    def update_path(self, version: int) -> Path:
        return self.dir / "updates" / f"{version}.bin"

    def open_update(self, version: int):
        """(bytes, the file open at version `version` as an int8 update of version - 1): the
        newest version's only; NOT_FOUND otherwise (the worker downloads the weights), and for
        one the room has not made yet (a close cut short may have left its update)."""
        if version > self.read()["version"]:
            raise RoomError(NOT_FOUND, f"the room has no version {version} yet")
        path = self.update_path(version)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise RoomError(NOT_FOUND, f"version {version} is not kept as an update: download "
                                       f"its weights") from None
        return os.fstat(f.fileno()).st_size, f

    # ---- pseudo-gradients ----------------------------------------------------------------
    def expected_bytes(self) -> int:
        return payload_bytes(self.room.codec, self.numel)

    def bound(self, st: dict) -> float:
        """The most one element of an honest pseudo-gradient of the current version can be."""
        return delta_bound(self.config, st["max_abs_decay"], st["max_abs"])

    def accept(self, token: str, version: int, body_path: Path, now: float,
               steps: int | None = None) -> dict:
        """Worker's pseudo-gradient for `version` (the file `body_path`, moved into the round
        when taken) after `steps` inner steps (None: the round's inner_steps; fewer only once
        the round is cut, see cut_now). Returns {"version", "due": the round may close now,
        "refused": None or why it was not taken (a good one may still be sent), "cut": this
        one cut the round}; RoomError CONFLICT for a stale version or a second one."""
        st = self.load()
        wid = self.worker_of(st, token)
        worker, open_ = st["workers"][wid], st["open"]
        if st["finished"]:
            raise RoomError(CONFLICT, "this room run is finished: its last version is the model")
        H = self.room.inner_steps
        steps = H if steps is None else steps
        if not 1 <= steps <= H:
            raise RoomError(INVALID, f"a round has {H} inner steps: a pseudo-gradient of {steps} "
                                     "is not one")
        worker["sent_at"] = now
        if version != st["version"]:
            worker["stale"] += 1
            open_["stale"] += 1
            self._save(st)
            raise RoomError(CONFLICT, f"version {version} is not the one being trained (now "
                                      f"{st['version']}): this pseudo-gradient is dropped; "
                                      "download the current version and go on")
        if wid in open_["received"]:
            raise RoomError(CONFLICT, f"worker {wid} already sent its pseudo-gradient for version "
                                      f"{version}")
        if steps < H and open_.get("cut_at") is None:
            raise RoomError(CONFLICT, f"version {version}'s round is not cut: a pseudo-gradient of "
                                      f"{steps} of its {H} inner steps is sent only once the room "
                                      "says so (wait_for_slowest off, half its workers done)")
        try:
            norm, top = self._measure(body_path)
            bound = self.bound(st)
            if top > bound:
                raise DeltaRefused(
                    f"an element moves by {top:.4g}, more than {self.room.inner_steps} AdamW "
                    f"steps at lr {self.config.lr:g} can move one ({bound:.4g})")
        except DeltaRefused as e:
            worker["refused"] += 1
            open_["refused"][wid] = str(e)
            self._save(st)
            return {"version": version, "due": self.due(st, now), "refused": str(e)}
        open_["refused"].pop(wid, None)      # refused before: this one counts
        nbytes = body_path.stat().st_size
        folder = self.dir / "deltas" / str(version)
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(body_path, folder / f"{wid}.bin")
        fsync_dir(folder)
        open_["received"][wid] = {"bytes": nbytes, "norm": norm, "at": now, "steps": steps}
        if open_["first_at"] is None:
            open_["first_at"] = now
        cut = open_.get("cut_at") is None and self.cut_now(st)
        if cut:
            open_["cut_at"] = now
        worker.update(bytes=worker["bytes"] + nbytes, deltas=worker["deltas"] + 1, missed=0)
        self._save(st)      # what was taken is committed first: a close redone has it
        return {"version": version, "due": self.due(st, now), "refused": None, "cut": cut}

    def cut_now(self, st: dict) -> bool:
        """A round that does not wait for the slowest (wait_for_slowest off) is cut once half
        its active workers (rounded up) have sent a whole round: the others then send what
        they have trained (the room's page and GET room say so: open.cut), and the close
        weights each pseudo-gradient by its steps. Half, not all but one: with two slow
        laptops of four neither waits for the other; with equal ones the last are cut a step
        or two short at most."""
        if self.room.wait_for_slowest:
            return False
        H = self.room.inner_steps
        whole = sum(1 for r in st["open"]["received"].values() if r.get("steps", H) >= H)
        return whole >= -(-len(_active(st)) // 2)

    def _measure(self, path: Path) -> tuple[float, float]:
        """(L2 norm in float64, largest |value|) of a body on disk, padding excluded, a chunk
        at a time; DeltaRefused for a wrong size or a value that is not finite."""
        total, top = 0.0, 0.0
        for start, x in chunks(path, self.room.codec, self.numel):
            x[~self.mask[start:start + x.size]] = 0
            x64 = x.astype(np.float64)
            total += float(np.dot(x64, x64))
            top = max(top, float(np.abs(x).max(initial=0.0)))
        return math.sqrt(total), top

    def _discard_delta(self, version: int, wid: str) -> None:
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
        return (got >= self.room.quorum
                and now >= open_["first_at"] + self.room.round_deadline_s)

    def drop_silent(self, now: float) -> list[str]:
        """The sweep's first call (under the lock): workers that hold a slot for free leave.
        One that has sent nothing since it (re)joined leaves a round deadline after it joined
        or after the version it trains appeared, whichever is later; one that sent before and
        now sends nothing for missed_rounds deadlines after the round's first pseudo-gradient
        leaves too (its quorum out of reach, it would hold the room for good)."""
        st = self.load()
        if st["finished"]:
            return []
        open_, deadline = st["open"], self.room.round_deadline_s
        gone = []
        for wid, w in _active(st).items():
            if wid in open_["received"] or wid in open_["refused"]:
                continue
            since = max(w.get("rejoined") or w["joined"], open_["opened_at"] or 0)
            if not _sent_since_join(w) and now >= since + deadline:
                w.update(left=now, why=f"sent nothing within {deadline:g} s of joining")
                gone.append(wid)
            elif open_["first_at"] is not None and \
                    now >= open_["first_at"] + self.room.missed_rounds * deadline:
                w.update(left=now, why=f"sent nothing for {self.room.missed_rounds} round "
                                       "deadlines")
                gone.append(wid)
        if gone:
            self._save(st)
        return gone

    def wait_for_disk(self, why: str, now: float) -> float:
        """A close that could not reserve its bytes: the room says so and tries again later
        (WAIT_BACKOFF_S, longer each time). Returns when."""
        st = self.load()
        tries = st["open"].get("waits", 0)
        at = now + WAIT_BACKOFF_S[min(tries, len(WAIT_BACKOFF_S) - 1)]
        st["open"].update(waiting=why, retry_at=at, waits=tries + 1)
        self._save(st)
        return at

    def close_if_due(self, now: float, force: bool = False) -> dict | None:
        """Closes the open round when due (and not waiting for disk, unless `force`); its
        line, or None."""
        st = self.load()
        if not self.due(st, now):
            return None
        if not force and now < (st["open"].get("retry_at") or 0):
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
        for partial in self.update_path(0).parent.glob("*.partial"):   # a close cut short
            partial.unlink(missing_ok=True)
        return st

    def _close(self, st: dict, now: float) -> dict:
        v, open_ = st["version"], st["open"]
        ids = sorted(open_["received"], key=int)
        norms = [open_["received"][w]["norm"] for w in ids]
        H = self.room.inner_steps
        steps = [open_["received"][w].get("steps", H) for w in ids]
        got = close_round(self.ckpts, self.run_id, v, self.numel, self.room.codec,
                          [self.dir / "deltas" / str(v) / f"{w}.bin" for w in ids], norms,
                          st["norm_history"], self.room, self.mask, self.decay, steps,
                          *((self.update_path(v + 1), residual_of(self.update_path(v)))
                            if self.sends_updates() else ()))
        line = {"round": v, "version": v + 1, "closed_at": now,
                "opened_at": open_["opened_at"], "median_norm": float(np.median(norms)),
                "clip_limit": got["limit"], "reference_norm": got["reference_norm"],
                "outer_grad_norm": got["outer_grad_norm"],
                "step_norm": got["step_norm"], "rejected": got["rejected"],
                "dropped": ids if got["rejected"] else [],
                "workers": {w: {**open_["received"][w], "clip_scale": got["scales"][i],
                                "cosine": got["cosines"][i], "averaged": i in got["kept"]}
                            for i, w in enumerate(ids)},
                "refused": open_["refused"], "stale": open_["stale"],
                "cut_at": open_.get("cut_at")}
        for wid, worker in _active(st).items():      # who sent nothing this round
            if wid not in open_["received"] and wid not in open_["refused"]:
                worker["missed"] += 1
                if worker["missed"] >= self.room.missed_rounds:
                    worker.update(left=now, why=f"sent nothing for {worker['missed']} rounds")
        if got["rejected"] is None:
            st["max_abs_decay"], st["max_abs"] = got["max_abs_decay"], got["max_abs"]
            st["norm_history"] = (st["norm_history"] + got["clipped_norms"])[-HISTORY_NORMS:]
        st.update(version=v + 1, open=_open_round(now), last_round=line,
                  finished=v + 1 >= self.rounds)
        self._append("rounds.jsonl", line)   # before the state: a redo appends it again
        self._save(st)
        shutil.rmtree(self.dir / "deltas" / str(v), ignore_errors=True)
        newest = self.update_path(v + 1)
        for older in newest.parent.glob("*"):    # a worker behind takes the weights
            if older not in (newest, residual_of(newest)):
                older.unlink(missing_ok=True)
        return st

    # ---- reports and reading -------------------------------------------------------------
    def report(self, token: str, version: int, losses: list[float],
               eval_loss: float | None, now: float, max_bytes: int,
               timings: dict | None = None) -> None:
        """A worker's inner losses of the round that trained `version`, the eval loss of
        `version`'s global weights when it measured one, and how it spent `version` when it
        says (`timings`, ms: routes/room.py's Timings): one per worker and version, within
        the run's storage budget (`max_bytes`, ANDREA_MAX_RUN_BYTES)."""
        st = self.load()
        wid = self.worker_of(st, token)
        worker = st["workers"][wid]
        if not worker["joined_version"] <= version <= st["version"]:
            raise RoomError(CONFLICT, f"worker {wid} trained no version {version} here")
        if len(losses) > self.room.inner_steps:
            raise RoomError(INVALID, f"a round has {self.room.inner_steps} inner steps, not "
                                     f"{len(losses)} losses")
        if not all(math.isfinite(x) for x in losses) or \
                (eval_loss is not None and not math.isfinite(eval_loss)):
            raise RoomError(INVALID, "losses must be finite numbers")
        if version in worker.setdefault("reported", []):
            raise RoomError(CONFLICT, f"worker {wid} already reported version {version}: one "
                                      "report a version")
        line = {"worker": int(wid), "version": version, "at": now, "losses": losses,
                "eval_loss": eval_loss}
        if timings is not None:           # (older reports have none)
            line["timings"] = timings
        size = len(json.dumps(line)) + 1
        if st["report_bytes"] + size > max_bytes:
            raise RoomError(DISK_FULL, f"this run's storage budget is used up: its reports take "
                                       f"{st['report_bytes']} of the {max_bytes} bytes a run may "
                                       "store (ANDREA_MAX_RUN_BYTES); this report was not stored")
        worker["reported"].append(version)
        st["report_bytes"] += size
        if eval_loss is not None:
            st["evals"].setdefault(str(version), {})[wid] = eval_loss
        self._save(st)
        self._append("reports.jsonl", line)

    def progress(self, token: str, version: int, step: int, now: float) -> None:
        """A worker has trained `step` of the round's inner steps on `version` (0: it has the
        version and trains its first): the room's page shows who trains, sends or waits. Kept
        in progress.json, rewritten without fsync (it is not the room's commit)."""
        st = self.read()
        wid = self.worker_of(st, token)
        # Overlapped, a worker that sent its round trains the next while this one closes.
        ahead = self.room.overlap and version == st["version"] + 1 < self.rounds
        if version != st["version"] and not ahead:
            raise RoomError(CONFLICT, f"version {version} is not the one being trained (now "
                                      f"{st['version']})")
        H = self.room.inner_steps
        if not 0 <= step <= H:
            raise RoomError(INVALID, f"a round has {H} inner steps: step {step} is not one")
        seen = self.read_progress()
        seen[wid] = {"version": version, "step": step, "at": now}
        path = self.dir / "progress.json"
        tmp = path.with_name(f"progress.{os.getpid()}.{time.monotonic_ns()}{TEMP_SUFFIX}")
        try:
            tmp.write_text(json.dumps(seen), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def read_progress(self) -> dict:
        """{worker id: {version, step, at}}: each worker's last reported inner step."""
        try:
            seen = json.loads((self.dir / "progress.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return seen if isinstance(seen, dict) else {}

    def closed_rounds(self) -> list[dict]:
        """rounds.jsonl's lines, one per round (a close redone after a crash wrote its line
        twice: the last one counts)."""
        return list({line["round"]: line for line in read_lines(self.dir / "rounds.jsonl")}
                    .values())

    def reports(self, offset: int = 0, limit: int | None = None) -> tuple[list[dict], int]:
        """(reports offset..offset + limit, how many there are)."""
        lines = read_lines(self.dir / "reports.jsonl")
        return lines[offset:None if limit is None else offset + limit], len(lines)


def evals(st: dict) -> list[dict]:
    """Per version, the median of the workers' eval-loss reports, and the workers whose report
    is far from it (more than FAR_MADS median absolute deviations and FAR_FRACTION of the
    median): one worker cannot draw the curve."""
    out = []
    for v in sorted(st.get("evals", {}), key=int):
        by = st["evals"][v]
        xs = np.array(list(by.values()), np.float64)
        med = float(np.median(xs))
        mad = float(np.median(np.abs(xs - med)))
        far = [int(w) for w, x in by.items()
               if len(xs) >= 3 and abs(x - med) > max(FAR_MADS * mad, FAR_FRACTION * abs(med))]
        out.append({"version": int(v), "median": med, "workers": len(xs), "outliers": far})
    return out


FAR_MADS, FAR_FRACTION = 3.0, 0.05


def worker_state(st: dict, wid: str, progress: dict, inner_steps: int) -> dict:
    """What worker `wid` does now, in the words the room's page shows: {"state", "step"}.
      left      it left the room (or was removed, or dropped: its `why`);
      done      the room finished with it in it;
      waiting   its pseudo-gradient for this round is in: it waits for the round to close;
      ahead     its pseudo-gradient is in and, overlapped, it trains the next round meanwhile
                (`step` of inner_steps done on it);
      refused   its pseudo-gradient was refused (a good one may follow);
      sending   it trained the round's last inner step: its pseudo-gradient is on its way;
      training  `step` of inner_steps done on the current version (its last report);
      starting  nothing reported on the current version yet (it takes the version, measures
                its eval loss, or compiles its kernels)."""
    w, open_ = st["workers"][wid], st["open"]
    if w["left"] is not None:
        return {"state": "left", "step": None}
    if st["finished"]:
        return {"state": "done", "step": None}
    at = progress.get(wid)
    if wid in open_["received"]:
        if at and at.get("version") == st["version"] + 1:
            return {"state": "ahead", "step": int(at["step"])}
        return {"state": "waiting", "step": inner_steps}
    if wid in open_["refused"]:
        return {"state": "refused", "step": None}
    since = w.get("rejoined") or w["joined"]
    if not at or at.get("version") != st["version"] or at.get("at", 0) < since:
        return {"state": "starting", "step": None}
    step = int(at["step"])
    return {"state": "sending" if step >= inner_steps else "training", "step": step}


def summary(data_dir: Path, run_id: str, config: RunConfig) -> dict | None:
    """A room run in a line of the runs list: its rounds closed of all, whether it finished,
    its workers now (training: active while it runs; 0 once it finished) and all that joined,
    and its last global eval loss (the median of the newest version measured) and its best;
    elapsed_s: from its first worker's join to its last round's close (None before one).
    Read without the lock (the state as committed); None where it has no room (yet)."""
    try:
        st = json.loads((room_dir(data_dir, run_id) / "state.json").read_text(encoding="utf-8"))
        measured = evals(st)
        last = measured[-1] if measured else None
        return {"version": st["version"], "rounds": rounds_total(config),
                "finished": st["finished"],
                "training": 0 if st["finished"] else len(_active(st)),
                "joined": len(st["workers"]),
                "eval_loss": last and last["median"], "eval_version": last and last["version"],
                "best_eval_loss": min((e["median"] for e in measured), default=None),
                "elapsed_s": _elapsed(st)}
    except (OSError, ValueError, KeyError, TypeError):    # (a damaged room: the list goes on)
        return None


def _elapsed(st: dict) -> float | None:
    closed = (st.get("last_round") or {}).get("closed_at")
    first = min((w["joined"] for w in st["workers"].values()), default=None)
    return None if closed is None or first is None else max(0.0, closed - first)


def _sent_since_join(w: dict) -> bool:
    """A pseudo-gradient (taken, refused or stale) since its latest (re)join."""
    return (w.get("sent_at") or -1) >= (w.get("rejoined") or w["joined"])


def _open_round(now: float | None = None) -> dict:
    return {"opened_at": now, "first_at": None, "received": {}, "refused": {}, "stale": 0,
            "waiting": None, "retry_at": None, "waits": 0, "cut_at": None}


def _active(st: dict) -> dict:
    return {wid: w for wid, w in st["workers"].items() if w["left"] is None}
