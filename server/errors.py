"""What the server's domain refuses, in its own words. A Refused error says which kind of
refusal it is and why; the room (RoomError), the checkpoints (CheckpointError) and the storage
budget (DiskFull) raise them, and no code below the web layer knows an HTTP status: one handler
(web/errors.py) maps each kind to its status, for every route."""

from __future__ import annotations

from enum import Enum


class Refusal(Enum):
    """Why a request is refused (web/errors.py HTTP_STATUS: the status of each)."""
    MALFORMED = "malformed"          # the request itself is wrong (a body, a size, a field)
    NOT_ALLOWED = "not allowed"      # wrong or missing token, removed, not this address
    NOT_FOUND = "not found"          # no such run, worker, version or checkpoint
    CONFLICT = "conflict"            # not now: stale, duplicate, finished, full
    GONE = "gone"                    # it was there and is no longer kept
    INVALID = "invalid"              # well-formed but not acceptable (out of bounds, not finite)
    TOO_OFTEN = "too often"          # past a rate: try again later
    BROKEN = "broken"                # the server's own data is damaged
    DISK_FULL = "disk full"          # the storage budget or the disk refused the bytes


class Refused(Exception):
    """A request the domain refuses: its `kind` (Refusal) and the sentence that says why;
    `retry_after_s`: when trying again may work (None: no advice)."""

    def __init__(self, kind: Refusal, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s


# The kinds by name, for the raise sites: RoomError(CONFLICT, "...").
MALFORMED, NOT_ALLOWED, NOT_FOUND, CONFLICT, GONE, INVALID, TOO_OFTEN, BROKEN, DISK_FULL = Refusal
