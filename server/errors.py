"""What the server's domain refuses, in its own words. A Refused error says which kind of
refusal it is and why; the room (RoomError), the checkpoints (CheckpointError) and the storage
budget (DiskFull), the store and the broker out of reach (StoreUnavailable, BrokerUnavailable)
and the sockets' protocol (telemetry/protocol.py ProtocolError) raise them, and no code below
the web layer knows an HTTP status or a close code: web/errors.py maps each kind to its status
for every route, and to its close code for every websocket."""

from __future__ import annotations

from enum import Enum


class Refusal(Enum):
    """Why a request is refused (web/errors.py: HTTP_STATUS and WS_CLOSE, each one's status
    and close code)."""
    MALFORMED = "malformed"          # the request itself is wrong (a body, a size, a field)
    NOT_ALLOWED = "not allowed"      # wrong or missing token, removed, not this address
    NOT_FOUND = "not found"          # no such run, worker, version or checkpoint
    CONFLICT = "conflict"            # not now: stale, duplicate, finished, full
    GONE = "gone"                    # it was there and is no longer kept
    INVALID = "invalid"              # well-formed but not acceptable (out of bounds, not finite)
    TOO_OFTEN = "too often"          # past a rate: try again later
    TOO_LARGE = "too large"          # a body or message past its size limit
    BROKEN = "broken"                # the server's own data is damaged
    UNAVAILABLE = "unavailable"      # not now, come back: the database or broker out of reach,
                                     # a viewer too far behind
    DISK_FULL = "disk full"          # the storage budget or the disk refused the bytes


class Refused(Exception):
    """A request the domain refuses: its `kind` (Refusal) and the sentence that says why;
    `retry_after_s`: when trying again may work (None: no advice)."""

    def __init__(self, kind: Refusal, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s


# When to come back after UNAVAILABLE (Retry-After): the database or broker may be back by then.
UNAVAILABLE_RETRY_S = 10

# The kinds by name, for the raise sites: RoomError(CONFLICT, "...").
(MALFORMED, NOT_ALLOWED, NOT_FOUND, CONFLICT, GONE, INVALID, TOO_OFTEN, TOO_LARGE, BROKEN,
 UNAVAILABLE, DISK_FULL) = Refusal
