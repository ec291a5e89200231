"""The life of a key's record, as a table (pure: no trio, no gosim, no I/O).

Two rules, after h11's ``_state.py``: everything that decides a record's next state is in
this file, and this file does not know which store keeps the record. The memory and
SQLite stores call these functions on the record they read; the Redis store runs the
same table in Lua (``stores/redis.py``, which must agree with this file: the contract
suite and the state-machine test run against both).

Glossary
--------
record       what a store keeps per (caller, key): state, fingerprint, fence, expiry,
             and once completed the outcome (ok flag + msgpack payload).
claim        the right to execute a key's request, held by one execution at a time.
lease        how long a claim holds without completing: ``expires_at`` of an
             IN_PROGRESS record. A lapsed claim is as good as absent: the next claim
             takes the key over.
fence        the fencing token of a claim: a store-wide counter, so every claim's token
             is higher than every earlier claim's, on this key and any other. Completion
             and release must present the current token; an older one is stale.
TTL          how long a COMPLETED record is kept (``expires_at`` of a COMPLETED record).
             An expired record is as good as absent: the key is new again (Stripe's rule).

States and events
-----------------
::

    ABSENT --CLAIM--> IN_PROGRESS --COMPLETE--> COMPLETED
                          |  |                      |
                   RELEASE  EXPIRE (lease)     EXPIRE (TTL)
                          v  v                      v
                         ABSENT                   ABSENT

ABSENT is not stored: a missing record, or one whose ``expires_at`` has passed (a store
may keep such a record until it is swept; it reads as ABSENT). A CLAIM on a live
IN_PROGRESS or COMPLETED record is not a transition: it is answered (BUSY, REPLAY or
MISMATCH) and changes nothing. A RENEW by the holder of the live claim keeps a record
IN_PROGRESS and moves its lease deadline later (never earlier): the holder's keep-alive,
so that a lease bounds how long a dead holder keeps the key, not how long a live one runs.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ._accel import speedups as _speedups
from ._errors import CorruptedRecord, StaleClaim
from ._keys import FINGERPRINT_SIZE

__all__ = [
    "ABSENT",
    "COMPLETED",
    "IN_PROGRESS",
    "TRANSITIONS",
    "ClaimKind",
    "ClaimResult",
    "Event",
    "IllegalTransition",
    "Record",
    "State",
    "claim",
    "complete",
    "next_state",
    "release",
    "renew",
    "state_at",
]


class State(enum.IntEnum):
    """A record's state. The integers are stored (SQLite column, Redis hash field)."""

    ABSENT = 0
    IN_PROGRESS = 1
    COMPLETED = 2


class Event(enum.IntEnum):
    CLAIM = 0
    COMPLETE = 1
    RELEASE = 2
    EXPIRE = 3


# Module constants are plain ints: IntEnum members hash and compare through Python code,
# and these are looked up on every call. ``State(x)`` names one in messages.
ABSENT: Final = int(State.ABSENT)
IN_PROGRESS: Final = int(State.IN_PROGRESS)
COMPLETED: Final = int(State.COMPLETED)
CLAIM: Final = int(Event.CLAIM)
COMPLETE: Final = int(Event.COMPLETE)
RELEASE: Final = int(Event.RELEASE)
EXPIRE: Final = int(Event.EXPIRE)

# The whole life of a record. Anything not listed is illegal.
TRANSITIONS: Final[dict[tuple[int, int], int]] = {
    (ABSENT, CLAIM): IN_PROGRESS,
    (IN_PROGRESS, COMPLETE): COMPLETED,
    (IN_PROGRESS, RELEASE): ABSENT,
    (IN_PROGRESS, EXPIRE): ABSENT,  # the lease lapsed
    (COMPLETED, EXPIRE): ABSENT,  # the TTL passed
}


class IllegalTransition(RuntimeError):
    """An event that the table does not allow in the current state (a bug in a store)."""


def next_state(state: int, event: int) -> int:
    """The state after ``event``; raises :class:`IllegalTransition` when not allowed."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise IllegalTransition(
            f"{Event(event).name} is not allowed in state {State(state).name}"
        ) from None


class Record(NamedTuple):
    """One key's record as stored. Immutable: every transition makes a new one (a named
    tuple: it is built on every call, and a frozen dataclass costs several times more).

    Invariant: ``payload is None`` exactly when ``state == IN_PROGRESS``.
    """

    state: int  # a State
    fingerprint: bytes
    fence: int
    expires_at: float  # lease deadline while IN_PROGRESS, end of retention once COMPLETED
    ok: bool = True  # COMPLETED: True for a value, False for a final ApplicationError
    payload: bytes | None = None  # COMPLETED: the msgpack-encoded value or error


def state_at(record: Record | None, now: float) -> int:
    """The state ``record`` is in at time ``now`` (ABSENT when missing or expired)."""
    if record is None or record.expires_at <= now:
        return ABSENT
    return record.state


class ClaimKind(enum.IntEnum):
    CLAIMED = 0  # the caller holds the key now, with ``record.fence``: run the handler
    REPLAY = 1  # completed with the same request: ``record`` holds the outcome
    BUSY = 2  # another live claim holds the key with the same request
    MISMATCH = 3  # the key is live with a different request: KeyReused


class ClaimResult(NamedTuple):
    kind: ClaimKind
    record: Record  # the new record when CLAIMED, else the stored one (unchanged)


_CLAIMED: Final = ClaimKind.CLAIMED
_CLAIM_TO: Final = TRANSITIONS[ABSENT, CLAIM]
_COMPLETE_TO: Final = TRANSITIONS[IN_PROGRESS, COMPLETE]
# A named tuple's own constructor is a Python function (keyword and default handling):
# about 3,300 instructions, against a few hundred for tuple.__new__ with every field
# given. The hot paths build their records through these.
_new_record: Final[
    Callable[[type[Record], tuple[int, bytes, int, float, bool, bytes | None]], Record]
] = tuple.__new__
_new_claim_result: Final[Callable[[type[ClaimResult], tuple[ClaimKind, Record]], ClaimResult]] = (
    tuple.__new__
)
_REPLAY: Final = ClaimKind.REPLAY
_BUSY: Final = ClaimKind.BUSY
_MISMATCH: Final = ClaimKind.MISMATCH


def claim(
    record: Record | None, fingerprint: bytes, now: float, lease: float, fence: int
) -> ClaimResult:
    """Answer a claim of a key whose stored record is ``record``.

    ``fence`` is the store's next fencing token; it is used (and the store must advance
    its counter) only when the result is CLAIMED. The store writes ``result.record`` then.
    """
    if record is None or record.expires_at <= now:  # state_at(record, now) == ABSENT
        new = _new_record(Record, (_CLAIM_TO, fingerprint, fence, now + lease, True, None))
        return _new_claim_result(ClaimResult, (_CLAIMED, new))
    if record.fingerprint != fingerprint:
        return _new_claim_result(ClaimResult, (_MISMATCH, record))
    if record.state == COMPLETED:
        return _new_claim_result(ClaimResult, (_REPLAY, record))
    return _new_claim_result(ClaimResult, (_BUSY, record))


def _check_holder(record: Record | None, fence: int, now: float, caller: str, key: str) -> Record:
    state = state_at(record, now)
    if record is None:
        raise StaleClaim(caller, key, fence, "the record is gone (released or swept)")
    if record.fence != fence:
        raise StaleClaim(caller, key, fence, f"taken over by claim {record.fence}")
    if state == ABSENT:
        raise StaleClaim(caller, key, fence, "its lease lapsed")
    if state == COMPLETED:
        raise StaleClaim(caller, key, fence, "it was already completed")
    return record


def complete(
    record: Record | None,
    fence: int,
    ok: bool,
    payload: bytes,
    now: float,
    ttl: float,
    caller: str,
    key: str,
) -> Record:
    """The record after the holder of claim ``fence`` completes with ``(ok, payload)``.

    Raises :class:`StaleClaim` (and the store must write nothing) unless ``record`` is
    the live IN_PROGRESS record of claim ``fence``.
    """
    held = _check_holder(record, fence, now, caller, key)  # live and IN_PROGRESS, or raises
    return _new_record(Record, (_COMPLETE_TO, held.fingerprint, fence, now + ttl, ok, payload))


def release(record: Record | None, fence: int, now: float, caller: str, key: str) -> int:
    """Check that the holder of claim ``fence`` may release ``record``; returns ABSENT
    (the store deletes the record). Raises :class:`StaleClaim` otherwise."""
    held = _check_holder(record, fence, now, caller, key)
    return next_state(held.state, RELEASE)


def renew(
    record: Record | None, fence: int, now: float, lease: float, caller: str, key: str
) -> Record:
    """The record after the holder of claim ``fence`` renews its lease to ``now + lease``
    (a deadline already later is kept). Raises :class:`StaleClaim` (and the store must
    write nothing) unless ``record`` is the live IN_PROGRESS record of claim ``fence``."""
    held = _check_holder(record, fence, now, caller, key)
    expires = max(held.expires_at, now + lease)
    return _new_record(Record, (IN_PROGRESS, held.fingerprint, fence, expires, True, None))


def decode_record(row: tuple[Any, ...], store: str, caller: str, key: str) -> Record:
    """The record a store's row ``(state, fingerprint, fence, expires_at, ok, payload)``
    holds, checked: CorruptedRecord (naming ``store``, ``caller`` and ``key``) for a
    row no store writes, so a damaged row is never taken for a record."""
    state, fp, fence, expires_at, ok, payload = row
    where = f"{store}: record (caller={caller!r}, key={key!r})"
    if state not in (IN_PROGRESS, COMPLETED):
        raise CorruptedRecord(f"{where}: state {state!r} is not 1 or 2")
    if type(fp) is not bytes or len(fp) != FINGERPRINT_SIZE:
        raise CorruptedRecord(f"{where}: fingerprint is not {FINGERPRINT_SIZE} bytes: {fp!r:.80}")
    if type(fence) is not int or fence < 1:
        raise CorruptedRecord(f"{where}: fence {fence!r} is not a positive integer")
    if type(expires_at) not in (float, int):
        raise CorruptedRecord(f"{where}: expires_at {expires_at!r} is not a number")
    if ok not in (0, 1):
        raise CorruptedRecord(f"{where}: ok {ok!r} is not 0 or 1")
    if state == COMPLETED:
        if type(payload) is not bytes:
            raise CorruptedRecord(f"{where}: completed without a payload: {payload!r:.80}")
        return Record(COMPLETED, fp, fence, float(expires_at), bool(ok), payload)
    if payload is not None:
        raise CorruptedRecord(f"{where}: in progress with a payload")
    return Record(IN_PROGRESS, fp, fence, float(expires_at))


# The C twins of claim() and complete() (idempotency/_speedups_record.c.h), when built: they
# answer the common cases and call the functions above, kept as the reference, for the
# rest (a refused completion among them, so its errors are these).
_py_claim: Final = claim
_py_complete: Final = complete
if _speedups is not None:
    _speedups.configure_record(
        record=Record,
        claim_result=ClaimResult,
        claimed=_CLAIMED,
        replay=_REPLAY,
        busy=_BUSY,
        mismatch=_MISMATCH,
        in_progress=IN_PROGRESS,
        completed=COMPLETED,
        claim=_py_claim,
        complete=_py_complete,
    )
    claim = _speedups.claim
    complete = _speedups.complete
