"""The errors of the idempotency layer: who raised them, when, and what to do.

Pure: imports neither trio nor gosim. Three families:

* **Request errors**, the caller's fault, raised before anything is claimed or stored:
  :class:`InvalidKey`, :class:`InvalidRequest`, :class:`KeyReused`.
* **Protocol outcomes** of a key's life: :class:`InProgress` (another execution holds the
  key), :class:`StaleClaim` (this execution lost the key before it could record).
* **Store errors**, the store's fault: :class:`StoreUnavailable` (it cannot be reached or
  written now; nothing was recorded by the failed operation) and :class:`CorruptedRecord`
  (a stored record cannot be read back). Both say which store and which record.

A handler's own refusal is not an error of this layer: it raises
:class:`ApplicationError`, which is recorded (when final) and replayed like a value.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApplicationError",
    "CorruptedRecord",
    "IdempotencyError",
    "InProgress",
    "InvalidKey",
    "InvalidRequest",
    "InvalidResult",
    "KeyReused",
    "StaleClaim",
    "StoreError",
    "StoreUnavailable",
]


class IdempotencyError(Exception):
    """Base class of every error raised by :mod:`idempotency` itself."""


class InvalidKey(IdempotencyError, ValueError):
    """The idempotency key or the caller identity is malformed.

    Raised by ``Idempotency.run`` before anything is stored. A key is 1-255 printable
    ASCII characters (space to ``~``); a caller is 1-255 printable characters. A store's
    claim raises it too, before the claim joins a batch, for a caller or key that is not
    a str of at most 255 characters (the stores' bound). Fix the client: retrying the
    same key cannot succeed.
    """


class InvalidRequest(IdempotencyError, TypeError):
    """The request cannot be fingerprinted: its operation is not a string, or its
    arguments are not msgpack-serialisable or exceed the size limit; or the store
    cannot hold its caller or key (PostgreSQL: a NUL, or a character the database's
    encoding lacks).

    Raised before anything is stored. The message says which part failed and why.
    """


class InvalidResult(IdempotencyError, TypeError):
    """The handler's result (or its effect's result) cannot be recorded: it is not
    msgpack-serialisable or is larger than the result limit (``max_result_bytes``; a
    store refuses an outcome past ``stores.MAX_PAYLOAD_BYTES`` itself).

    Raised only when nothing was recorded and no store effect stayed: the claim was
    released, and the effect was rolled back (SQLite) or had written nothing (a plain
    value, a ``LuaEffect`` that only read). The handler's external effects (if any) did
    happen. Fix the handler: a retry would run it again and fail the same way.

    An effect that cannot be undone once it ran (a ``MemoryEffect`` whose function
    returned, a ``LuaEffect`` that wrote) is not followed by this error: the key is
    completed with the final error ``UNRECORDED_RESULT`` instead, returned to this
    call and replayed to every retry, so the effect is applied once.
    """


class KeyReused(IdempotencyError, ValueError):
    """The key was already used by this caller for a different request (the IETF draft's
    422 Unprocessable Content).

    The stored record is neither replayed nor changed and the handler does not run. The
    client reused a key for a new request: it must pick a fresh key.
    """

    def __init__(self, caller: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} of caller {caller!r} was used for a different request"
        )
        self.caller = caller
        self.key = key


class InProgress(IdempotencyError):
    """Another execution holds the key and has not finished (the draft's 409 Conflict).

    Raised at once with ``wait=False``, or when a waiting duplicate's own time ran out
    before the first execution finished. Nothing changed; retry the same key later to get
    the first execution's outcome.
    """

    def __init__(self, caller: str, key: str, waited: float | None = None) -> None:
        after = "" if waited is None else f" after waiting {waited:.3g} s"
        super().__init__(f"idempotency key {key!r} of caller {caller!r} is in progress{after}")
        self.caller = caller
        self.key = key


class StaleClaim(IdempotencyError):
    """This execution's claim is no longer the key's current claim: its lease lapsed, and
    the key was released, swept or taken over by a newer execution with a higher fencing
    token.

    The completion was refused and changed nothing; an effect in the store's transaction
    was rolled back with it. Effects outside the store may have happened (that is the
    at-least-once mode: fence them with ``call.fence``). Retry the call to get the current
    execution's outcome.
    """

    def __init__(self, caller: str, key: str, fence: int, why: str) -> None:
        super().__init__(
            f"claim {fence} on idempotency key {key!r} of caller {caller!r} is stale: {why}"
        )
        self.caller = caller
        self.key = key
        self.fence = fence


class StoreError(IdempotencyError):
    """Base class of the store's failures; the message names the store and the record."""


class StoreUnavailable(StoreError, OSError):
    """The store could not be reached or written (database locked past the busy timeout,
    disk error, Redis down or unreachable).

    The operation that failed recorded nothing (its transaction or script did not run or
    was rolled back), and nothing acknowledged before is lost. Retry once the store is
    back; the same key is safe to retry.
    """


class CorruptedRecord(StoreError, ValueError):
    """A stored record cannot be read back (a field of the wrong type, an unknown state,
    a database file that is not a database).

    The message names the store, the record and the field. The record is left as it is
    for inspection; the key cannot be used until an operator repairs or deletes it:
    ``python -m idempotency inspect STORE-URL CALLER KEY`` shows it and what is wrong,
    ``python -m idempotency forget STORE-URL CALLER KEY`` deletes it (the key is then new
    again). A damaged database file is this error too: restore the file from a backup.
    """


class ApplicationError(Exception):
    """A handler's refusal, in the msgpack-rpc shape ``[code, message, data]``.

    Raised by a handler (or by an effect inside the store's transaction) to answer the
    request with an error. When ``retryable`` is False (the default) the error is final:
    it is recorded like a value, and every retry of the key gets it again, replayed.
    When True, the claim is released and nothing is recorded, so a retry runs the handler
    again. ``replayed`` is True on an error read back from the store.
    """

    def __init__(
        self, code: int | str, message: str, data: Any = None, *, retryable: bool = False
    ) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data
        self.retryable = retryable
        self.replayed = False

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"
