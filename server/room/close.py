"""A round's close on disk: version v's weights and momentum read a chunk at a time, the round's
pseudo-gradients combined chunk by chunk (aggregate.py), the outer step taken on each chunk in
place (outer.py), and version v + 1 written at its offsets into one checkpoint file. Memory
holds a chunk of each delta and of the weights, never a whole copy, whatever the workers.

Before the commit the new version is checked: every weight finite, and the step no larger than
the accepted deltas allow (|lr (g + mu buf)| from |g| <= RobustMean.norm_allowed()). A version
that fails is not made: version v + 1 is version v again (weights and momentum unchanged) and
the round's line says why and names the workers whose deltas were dropped.

An int8 room sends its versions as it takes its pseudo-gradients: version v + 1 is version v
plus the outer step in the room's int8 codec (update_path: that body, which a worker holding v
downloads instead of the whole f32 weights, 4x fewer bytes), so the server's weights and every
worker's are the same floats. What the rounding leaves out is carried to the next round's
update (error feedback: the residual kept beside the update), so the versions drift from the
unquantized steps' sum by at most the last round's half code, not by a walk of every round's.
The outer step is checked, and its norm reported, before it is quantized; the version holds
the quantized one (its largest |w| are the version's)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from andrea.checkpoints import CheckpointStore
from andrea.durable import fsync_dir
from andrea.room import codec as wire
from andrea.room.aggregate import RobustMean, products
from andrea.room.codec import BLOCK, CHUNK, read_range
from andrea.room.outer import nesterov_step
from andrea.run_config import RoomConfig

OPTIMIZER = "room_outer"     # the checkpoints' optimizer name: global W and outer momentum
NORM_SLACK = 1e-3            # f32 rounding of the step against its float64 bound


def sections(numel: int) -> list[dict]:
    return [{"name": "W", "bytes": 4 * numel}, {"name": "momentum", "bytes": 4 * numel}]


def commit_arrays(ckpts: CheckpointStore, run_id: str, version: int, weights: np.ndarray,
                  decay: np.ndarray) -> tuple[float, float]:
    """Version `version` with these weights and zero momentum (version 0); returns the largest
    |w| of the decayed elements and of all (the next round's delta bound reads them)."""
    numel = weights.size

    def fill(f):
        f.seek(0)
        for start in range(0, numel, CHUNK):
            f.write(weights[start:start + CHUNK].astype("<f4").tobytes())
        # the momentum section: zeros, already there (the file was sized with truncate)
    ckpts.write_filled(run_id, version, 8 * numel, fill, OPTIMIZER, sections(numel))
    return max_abs(weights, decay), float(np.abs(weights).max(initial=0.0))


def max_abs(x: np.ndarray, where: np.ndarray) -> float:
    return float(np.abs(x[where]).max(initial=0.0))


def chunk_of(numel: int, n: int) -> int:
    """Elements a close reads of each delta at once: CHUNK, or less so that the n deltas'
    chunks together hold an eighth of the model at most (a close's temporaries are several of
    those: memory follows the model, not the workers; a quarter, with the cosines then on an
    f64 copy, put the peak at 2.96x the model's f32 size); a multiple of the codec's BLOCK."""
    return max(BLOCK, min(CHUNK, numel // (8 * max(n, 1)) // BLOCK * BLOCK))


def close_round(ckpts: CheckpointStore, run_id: str, version: int, numel: int, codec: str,
                delta_paths: list[Path], norms: list[float], history: list[float],
                room: RoomConfig, mask: np.ndarray, decay: np.ndarray,
                steps: list[int] | None = None, update_path: Path | None = None,
                residual_from: Path | None = None) -> dict:
    """Writes version `version` + 1 from version `version` and the round's deltas (`steps`:
    the inner steps each was trained over, its weight in the mean); returns what
    the round's line records: the clip (limit, scales, tau, deviation scales), the aggregate's
    and the step's norms, the new version's largest |w| (decayed, and all), and `rejected`
    (None, or why the new version was not made). update_path: where an int8 room's version
    v + 1 goes as an update of version v (written only with the version it makes), carrying
    the residual of version v's update (residual_from, where kept)."""
    files = [open(p, "rb") for p in delta_paths]
    update = None
    try:
        if update_path is not None:
            update = Update(update_path, numel, residual_from)
        def read(i: int, start: int, stop: int) -> np.ndarray:
            x = read_range(files[i], codec, numel, start, stop)
            x[~mask[start:stop]] = 0
            return x
        agg = RobustMean(read, norms, numel, history, room.clip_multiple,
                         chunk_of(numel, len(delta_paths)), steps)
        _, src = ckpts.open_verified(run_id, version)
        lr, mu = room.outer_lr, room.outer_momentum
        out = {"g2": 0.0, "s2": 0.0, "b2": 0.0, "finite": True, "max_abs": 0.0, "top": 0.0}

        def fill(f):
            with src:
                for start, g in agg.chunks():
                    n = g.size
                    src.seek(4 * start)
                    w = np.frombuffer(src.read(4 * n), "<f4").astype(np.float32)
                    src.seek(4 * (numel + start))
                    m = np.frombuffer(src.read(4 * n), "<f4").astype(np.float32)
                    before = w.copy()
                    nesterov_step(w, m, g, lr, mu, first=(version == 0))
                    out["g2"] += _sq(g)
                    out["b2"] += _sq(m)
                    out["s2"] += _sq(w - before)
                    if update is not None:      # the version: v plus the step as sent
                        w = before + update.put(start, w - before)
                    out["finite"] &= bool(np.isfinite(w).all() and np.isfinite(m).all())
                    out["max_abs"] = max(out["max_abs"], max_abs(w, decay[start:start + n]))
                    out["top"] = max(out["top"], float(np.abs(w).max(initial=0.0)))
                    f.seek(4 * start)
                    f.write(w.astype("<f4").tobytes())
                    f.seek(4 * (numel + start))
                    f.write(m.astype("<f4").tobytes())
        rejected = None
        try:
            ckpts_meta = _write_checked(ckpts, run_id, version, numel, fill, out, agg, lr, mu)
            if update is not None:
                update.commit()
        except _Rejected as e:
            rejected = str(e)
        g_norm, step_norm = math.sqrt(out["g2"]), math.sqrt(out["s2"])
        if rejected is not None:       # version v again: the round changes nothing
            ckpts_meta = _copy_version(ckpts, run_id, version, numel)
        return {"limit": agg.limit, "reference_norm": agg.reference, "scales": agg.scales,
                "cosines": agg.cosines, "kept": agg.kept,
                "clipped_norms": agg.clipped_norms(), "outer_grad_norm": g_norm,
                "step_norm": step_norm, "rejected": rejected,
                "max_abs_decay": out["max_abs"] if rejected is None else None,
                "max_abs": out["top"] if rejected is None else None,
                "sha256": ckpts_meta["sha256"]}
    finally:
        for f in files:
            f.close()
        if update is not None:
            update.discard()


class Update:
    """Version v + 1 as an int8 update of version v (codec.py's int8 body), written chunk by
    chunk at its offsets (the chunk's block scales, then its codes), with the residual the
    rounding left (f32 [numel], `path` with suffix .residual) read from version v's where it
    is kept. commit() makes both the version's (after the version itself); discard() removes
    what was not committed."""

    def __init__(self, path: Path, numel: int, residual_from: Path | None):
        self.path, self.numel = path, numel
        self.blocks = -(-numel // BLOCK)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.files = {path: open(_partial(path), "wb"),
                      residual_of(path): open(_partial(residual_of(path)), "wb")}
        self.out, self.residual_out = self.files.values()
        self.out.truncate(wire.payload_bytes("int8", numel))
        self.residual_in = None
        if residual_from is not None and residual_from.is_file() \
                and residual_from.stat().st_size == 4 * numel:
            self.residual_in = open(residual_from, "rb")

    def put(self, start: int, step: np.ndarray) -> np.ndarray:
        """Writes elements start.. of the step plus the carried residual (start a multiple of
        BLOCK); returns them as a worker decodes them (f32), what the version adds."""
        if self.residual_in is not None:
            self.residual_in.seek(4 * start)
            step = step + np.frombuffer(self.residual_in.read(4 * step.size), "<f4")
        body = wire.encode(step, "int8")
        nb = -(-step.size // BLOCK)
        self.out.seek(4 * (start // BLOCK))
        self.out.write(body[:4 * nb])
        self.out.seek(4 * self.blocks + start)
        self.out.write(body[4 * nb:])
        sent = wire.int8_values(body, step.size)
        self.residual_out.seek(4 * start)
        self.residual_out.write((step - sent).astype("<f4").tobytes())
        return sent

    def commit(self) -> None:
        for path, f in self.files.items():
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(_partial(path), path)
        fsync_dir(self.path.parent)

    def discard(self) -> None:
        if self.residual_in is not None:
            self.residual_in.close()
        for path, f in self.files.items():
            f.close()
            _partial(path).unlink(missing_ok=True)


def residual_of(update_path: Path) -> Path:
    return update_path.with_suffix(".residual")


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


class _Rejected(Exception):
    pass


def _write_checked(ckpts, run_id, version, numel, fill, out, agg, lr, mu) -> dict:
    """Version + 1 written by `fill`, committed only when its check passes (_Rejected)."""
    def checked(f):
        fill(f)
        g, s, b = math.sqrt(out["g2"]), math.sqrt(out["s2"]), math.sqrt(out["b2"])
        if not out["finite"]:
            raise _Rejected("the outer step made a weight or its momentum not finite")
        allowed = agg.norm_allowed()
        if g > allowed * (1 + NORM_SLACK):
            raise _Rejected(f"the aggregate's norm {g:.4g} exceeds what the accepted deltas "
                            f"allow ({allowed:.4g})")
        if s > lr * (g + mu * b) * (1 + NORM_SLACK) + 1e-30:
            raise _Rejected(f"the outer step's norm {s:.4g} exceeds lr (|g| + mu |buf|) = "
                            f"{lr * (g + mu * b):.4g}")
    return ckpts.write_filled(run_id, version + 1, 8 * numel, checked, OPTIMIZER,
                              sections(numel))


def _copy_version(ckpts: CheckpointStore, run_id: str, version: int, numel: int) -> dict:
    size, src = ckpts.open_section(run_id, version, 0)

    def fill(f):
        with src:
            f.seek(0)
            while block := src.read(CHUNK * 4):
                f.write(block)
    return ckpts.write_filled(run_id, version + 1, 8 * numel, fill, OPTIMIZER, sections(numel))


def _sq(x: np.ndarray) -> float:
    return float(products(x))
