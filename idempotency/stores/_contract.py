"""The contract every store keeps, and what the stores share.

A store keeps one :class:`~idempotency._record.Record` per (caller, key) and applies the
table of ``idempotency._record`` atomically: two concurrent claims of one key never both
succeed, a completion lands only with the current fencing token, and every operation is
all-or-nothing. ``Idempotency`` is the only caller; tests drive stores directly through
this interface (``tests/idempotency/test_store_contract.py`` runs one suite unchanged
against every store).

Guarantees, named apart (the docs of ``Idempotency`` repeat them):

* **Exactly-once effects** -- a handler that returns an :class:`Effect` of the store's
  kind has that effect run *inside the transaction that completes the record* (SQLite:
  the same connection, transaction and savepoint; Redis: the same Lua script; memory:
  the same step, with no other goroutine in between). A crash at any instant leaves
  either the effect and the record, or neither; a stale claim's effect is rolled back.
* **At-least-once effects with fencing** -- whatever a handler does outside the store
  (an email, a call to another service) happens once per execution, and an execution is
  repeated when its claim lapses or is released before it completes. ``call.fence`` rises
  with every claim: hand it to the external system so it can refuse an older one.
  While a handler runs, ``Idempotency`` renews its claim (:meth:`Store.renew`, fenced),
  so an execution is repeated when its holder died, not when it is slow.

Both or neither, on every path: an effect the store can roll back (SQLite) is rolled
back whenever its record is not written (a refusal's writes, an error, a result that
cannot be recorded, a stale claim, a failed commit), and the claim is released. An
effect the store cannot undo once it has run (a ``MemoryEffect`` whose function
returned, a ``LuaEffect`` that wrote) is never followed by a release: if its result
cannot be recorded, or a Lua script fails after writing, the key is completed with a
final error (code ``UNRECORDED_RESULT``) that every retry replays.

One mechanism per operation: the callback. An operation a store serves in batches has
one way to run, its call-back form (:meth:`OneStepStore.claim_and_complete_later`, and
``GroupCommitter.submit_later`` under every batched operation): ``done(result, None)``
or ``done(None, error)`` is called exactly once, by a goroutine of the runtime, once the
operation's transaction has committed or failed (an argument refused before it joins
a batch: at once, before the call-back form returns); no goroutine waits for it, and
the call-back form itself never raises. The awaiting form
(:meth:`OneStepStore.claim_and_complete`, ``GroupCommitter.submit``) is a wait on a
settle-once waiter that ``done`` settles (``idempotency._waiter.await_done``), written
once, here and in the committer: a store implements the call-back form only.

One call never fails another: a store that groups concurrent calls' operations into one
transaction or pipeline (SQLite, Redis) answers each operation alone. An operation that
cannot be applied (an argument the store cannot represent, an effect that raises or does
not compile, a corrupted record) fails with an error naming that call, and its
batch-mates complete as if it had not been there. Only a failure of the store itself (a
lost connection, a failed commit) fails a whole batch, with :class:`StoreUnavailable`.
Such a failure lasts as long as its cause: once the server is back or room is freed on
a full disk, the same store object serves calls again, without a restart
(``SQLiteStore`` bounds its write-ahead log for this: a log that only grew would fill
the room freed again).

Limits, the same for every store, checked at the door: what a store passes to its server
stays within every server's own limits, so no server refuses it mid-batch (which would
fail the batch's other calls) and no two stores' records meet.

* **Caller and key**: a claim (``claim``, ``claim_later``, ``claim_and_complete``) refuses
  a caller or key that is not a str of at most :data:`MAX_KEY_LENGTH` (255) characters,
  the bound ``validate_caller`` and ``validate_key`` put on them, with
  :class:`~idempotency.InvalidKey`, before it joins a batch: its batch-mates are
  untouched. The bound is in characters, the unit the IETF draft states keys in; 255
  characters are at most 1,020 bytes of UTF-8, so a caller and a key at the bound take
  at most about 2,050 bytes of an index entry, under PostgreSQL's btree limit (2,704
  bytes for the primary key's entry) and far under Redis' and SQLite's. The other
  operations find no record for a longer one (none can be stored).
  A caller or key the server cannot hold as text (PostgreSQL: a NUL, or a character
  the database's encoding lacks, in ``SQL_ASCII`` or ``LATIN1``) fails its own call with
  :class:`~idempotency.InvalidRequest` naming it; its batch-mates complete.
* **Outcome**: a completion refuses a payload longer than :data:`MAX_PAYLOAD_BYTES`
  (256 MiB) with :class:`~idempotency.InvalidResult`, and a ``max_result_bytes`` above
  it with ValueError, before it joins a batch; ``Idempotency(max_result_bytes=...)``
  refuses more at construction. The bound is under Redis' largest argument
  (``proto-max-bulk-len``, 512 MB by default; a server configured lower needs a lower
  ``max_result_bytes``), PostgreSQL's largest field and message (1 GB, which a payload
  takes twice over as hex) and SQLite's largest blob (``SQLITE_MAX_LENGTH``, 1e9 bytes).
  It bounds one call; a batch of several such outcomes may still exceed a server's
  message limit, so outcomes that large are better kept apart (a small
  ``max_batch``).
* **Names**: each store checks what it builds names of at construction, with a
  ValueError naming the parameter, the limit and the value's length (``PostgresStore``'s
  ``schema``: 1 to 63 bytes, PostgreSQL's identifier limit, past which it truncates
  names silently; ``RedisStore``'s ``prefix``: no ``rec:`` in it, which would let one
  store's keys be another's).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from gosim import lowlevel

from .._errors import ApplicationError, InvalidKey, InvalidResult
from .._keys import MAX_KEY_LENGTH
from .._outcome import encode_error, encode_result, encode_unrecorded
from .._record import ABSENT, COMPLETED, ClaimResult, Record, state_at
from .._waiter import await_done

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "CallbackStore",
    "Completion",
    "Effect",
    "Store",
    "StoreStatistics",
    "StoredRecord",
    "SynchronousStore",
    "bad_caller_or_key",
    "bad_completion",
    "bad_duration",
    "bad_max_result_bytes",
    "bad_outcome_size",
    "run_effect",
]


#: The longest outcome (encoded) any store records: see "Limits" in the module docstring.
MAX_PAYLOAD_BYTES: Final = 1 << 28


class Effect:
    """Base of the store-specific effects a handler may return to have them committed in
    the transaction that completes its record (``SQLiteEffect``, ``LuaEffect``,
    ``MemoryEffect``). A store refuses another store's kind with TypeError."""

    __slots__ = ()


class Completion(NamedTuple):
    """What the holder of a claim records: an encoded outcome, or an effect whose result
    becomes the outcome inside the store's transaction. (A named tuple: one is built per
    call, and a frozen dataclass costs several times more to build.)"""

    ok: bool
    payload: bytes | None  # None when ``effect`` is given
    effect: Effect | None
    ttl: float
    max_result_bytes: int


# Completion's own constructor is a Python function; this builds one in a C call
# (every field given, in order), about 3,000 instructions less on every call.
new_completion: Callable[
    [type[Completion], tuple[bool, bytes | None, Effect | None, float, int]], Completion
] = tuple.__new__


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """Counters of a store (``store.statistics()``)."""

    operations: int  # claims, completions, releases, reads and sweeps done
    batches: int  # transactions (SQLite) or pipelines (Redis) they were grouped into
    largest_batch: int


def run_effect(
    fn: Callable[[], Any], max_bytes: int, undo: Callable[[], None] | None = None
) -> tuple[bool, bytes]:
    """Run an effect's function; return the ``(ok, payload)`` to record.

    A final :class:`ApplicationError` becomes an error outcome: ``undo()`` is called first
    to roll back what the effect did, since a refusal records the error and nothing else.
    Anything else it raises (a retryable ApplicationError, a bug) propagates: the caller
    rolls back (``undo``) or, with no ``undo``, relies on the effect's rule that it
    raises before changing anything; either way it records nothing.

    A result that cannot be recorded: with ``undo`` (the store can roll the effect back)
    :class:`InvalidResult` propagates and the caller rolls back and records nothing.
    Without ``undo`` the effect has happened for good, so the key must not be released
    (a retry would apply it again): the final ``UNRECORDED_RESULT`` error is returned to
    be recorded instead.
    """
    try:
        value = fn()
    except ApplicationError as err:
        if err.retryable:
            raise
        if undo is not None:
            undo()
        return False, encode_error(err, max_bytes)
    try:
        return True, encode_result(value, max_bytes)
    except InvalidResult as exc:
        if undo is not None:
            raise
        return False, encode_unrecorded(str(exc))


def bad_duration(
    store: object, what: str, caller: str, key: str, name: str, seconds: object
) -> ValueError | None:
    """The error for a lease or TTL a store cannot apply (not a positive number of
    seconds; ``math.inf`` is one: never expires), naming the call; None when it is
    good. Checked before the operation joins a batch, so it fails alone."""
    if (type(seconds) is float or type(seconds) is int) and seconds > 0:  # NaN is not
        return None
    return ValueError(
        f"{store!r}: {what} of caller {caller!r}, key {key!r}: {name} must be a positive"
        f" number of seconds (math.inf: never), not {seconds!r}"
    )


def bad_caller_or_key(store: object, what: str, caller: object, key: object) -> InvalidKey | None:
    """The error for a caller or key a store cannot store (not a str, or longer than
    :data:`MAX_KEY_LENGTH` characters: see "Limits" in the module docstring), naming
    the call; None when both are good. Checked before a claim joins a batch."""
    for name, value in (("caller", caller), ("key", key)):
        if not isinstance(value, str):
            return InvalidKey(
                f"{store!r}: {what}: the {name} must be a str, not {type(value).__name__}"
            )
        n = str.__len__(value)
        if n > MAX_KEY_LENGTH:
            size = len(str.__str__(value).encode("utf-8", "surrogatepass"))
            return InvalidKey(
                f"{store!r}: {what} of caller {str.__str__(caller)!r:.60}, key"
                f" {str.__str__(key)!r:.60}: the {name} is {n} characters ({size} bytes)"
                f" long; a store takes at most MAX_KEY_LENGTH = {MAX_KEY_LENGTH} characters"
            )
    return None


def bad_completion(store: object, caller: str, key: str, c: Completion) -> Exception | None:
    """The error for a completion a store cannot record (a bad TTL, an outcome that is
    not bytes where no effect makes one, or one past :data:`MAX_PAYLOAD_BYTES`, a
    ``max_result_bytes`` above it), naming the call; None when it is good."""
    if c.effect is None and type(c.payload) is not bytes:
        return TypeError(
            f"{store!r}: completion of caller {caller!r}, key {key!r}: the payload must"
            f" be bytes when there is no effect, not {type(c.payload).__name__}"
        )
    bad = bad_outcome_size(store, caller, key, c)
    return bad or bad_duration(store, "completion", caller, key, "ttl", c.ttl)


def bad_outcome_size(store: object, caller: str, key: str, c: Completion) -> Exception | None:
    """The error for a completion whose outcome may exceed :data:`MAX_PAYLOAD_BYTES`: a
    payload longer (InvalidResult), or with an effect, a ``max_result_bytes`` above it
    (ValueError); None else. Checked before a completion joins a batch."""
    if c.effect is None:
        if isinstance(c.payload, bytes) and len(c.payload) > MAX_PAYLOAD_BYTES:
            return InvalidResult(
                f"{store!r}: completion of caller {caller!r}, key {key!r}: the outcome is"
                f" {len(c.payload)} bytes; a store takes at most MAX_PAYLOAD_BYTES ="
                f" {MAX_PAYLOAD_BYTES}"
            )
    elif bad := bad_max_result_bytes(c.max_result_bytes):
        return ValueError(f"{store!r}: completion of caller {caller!r}, key {key!r}: {bad}")
    return None


def bad_max_result_bytes(value: object) -> str | None:
    """Why ``value`` cannot be a ``max_result_bytes`` (not a number, or above
    :data:`MAX_PAYLOAD_BYTES`), or None."""
    if isinstance(value, (int, float)) and value <= MAX_PAYLOAD_BYTES:  # NaN is not
        return None
    return (
        f"max_result_bytes must be a number of at most MAX_PAYLOAD_BYTES = {MAX_PAYLOAD_BYTES}"
        f" (what every store can record), not {value!r}"
    )


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A key's record as an operator sees it (:meth:`Store.inspect`, :meth:`Store.forget`).

    ``record`` is the decoded record, None when it cannot be read back; ``problem`` then
    says why (what :class:`~idempotency.CorruptedRecord` would say). ``now`` is the
    store's clock when it was read, in the units of ``record.expires_at``.
    """

    caller: str
    key: str
    record: Record | None
    problem: str | None
    now: float

    @property
    def state(self) -> str:
        """``IN_PROGRESS``, ``COMPLETED``, ``EXPIRED`` (kept until swept, read as
        absent) or ``CORRUPTED``."""
        rec = self.record
        if rec is None:
            return "CORRUPTED"
        if state_at(rec, self.now) == ABSENT:
            return "EXPIRED"
        return "COMPLETED" if rec.state == COMPLETED else "IN_PROGRESS"


class Store(abc.ABC):
    """A durable (or not) home for records; see the module docstring for the contract.

    A store whose claims and completions never wait derives from
    :class:`SynchronousStore` instead, which adds plain-call twins of both.
    """

    @abc.abstractmethod
    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        """Apply ``_record.claim`` atomically to the stored record; write it when CLAIMED."""

    @abc.abstractmethod
    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        """Record the outcome of claim ``fence`` (running its effect in the same
        transaction); return the completed record. Raises StaleClaim and changes nothing
        unless ``fence`` is the live claim."""

    @abc.abstractmethod
    async def release(self, caller: str, key: str, fence: int) -> bool:
        """Delete the record when ``fence`` is its live claim; False (and no change) else."""

    async def renew(self, caller: str, key: str, fence: int, lease: float) -> Record:
        """Extend the live claim ``fence`` to ``lease`` seconds from now (a later deadline
        is kept); return the renewed record. Raises StaleClaim and changes nothing
        unless ``fence`` is the live claim. ``Idempotency`` calls it while a handler
        runs (the holder's keep-alive). A store that cannot renew raises
        NotImplementedError (this default): its leases then bound every handler."""
        raise NotImplementedError(f"{type(self).__name__} cannot renew a claim")

    @abc.abstractmethod
    async def get(self, caller: str, key: str) -> Record | None:
        """The live record of (caller, key), or None when absent or expired."""

    @abc.abstractmethod
    async def sweep(self) -> int:
        """Delete the expired records; return how many were deleted."""

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, in the units of ``Record.expires_at`` (seconds)."""

    @abc.abstractmethod
    def statistics(self) -> StoreStatistics:
        """Counters since the store was opened."""

    def close(self) -> None:  # noqa: B027 -- optional: a store may hold nothing to release
        """Release the store's resources (a connection); idempotent."""

    # Operator's tools (``python -m idempotency inspect|forget|sweep``), with :meth:`sweep`.
    # Optional: a store without them says so. Memory, SQLite, Redis and PostgreSQL have them.

    async def inspect(self, caller: str, key: str) -> StoredRecord | None:
        """What is stored for (caller, key), as it is: an expired record too (it reads as
        absent to ``get`` and claims), and a damaged one, with what is wrong with it
        instead of raising :class:`~idempotency.CorruptedRecord`. None when nothing is
        stored. Changes nothing."""
        raise NotImplementedError(f"{self!r} has no operator tools (inspect)")

    async def forget(self, caller: str, key: str, *, force: bool = False) -> StoredRecord | None:
        """Delete what is stored for (caller, key), atomically with the check below, and
        return what was deleted; None when nothing was stored.

        A live in-progress record (a holder may be running its handler) is refused with
        :class:`~idempotency.InProgress` and kept, unless ``force``: forgetting it lets
        the next claim run the request again while the old holder may still complete
        (its completion is then refused as stale, but what it did outside the store
        stays). A completed, expired or damaged record is deleted: the key is new again.
        """
        raise NotImplementedError(f"{self!r} has no operator tools (forget)")


class SynchronousStore(Store):
    """A store whose claims and completions never wait (``MemoryStore``).

    :meth:`claim_sync` and :meth:`complete_sync` are the same operations as plain calls,
    and must do exactly what their ``async`` twins do: ``Idempotency`` calls them
    without a coroutine per operation.
    """

    @abc.abstractmethod
    def claim_sync(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        """:meth:`claim` as a plain call."""

    @abc.abstractmethod
    def complete_sync(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        """:meth:`complete` as a plain call."""


class CallbackStore(Store):
    """A store whose claims and completions are call-back operations (the batched
    stores: SQLite, Redis, Postgres): :meth:`claim_later` and :meth:`complete_later`
    are the one mechanism, and :meth:`claim` and :meth:`complete` the waits on it.
    ``Idempotency`` calls them with the rest of its call as the callback, so a call
    whose handler returns at once waits on no goroutine: the store's batch runs it on.
    """

    @abc.abstractmethod
    def claim_later(
        self,
        caller: str,
        key: str,
        fingerprint: bytes,
        lease: float,
        done: Callable[[ClaimResult | None, BaseException | None], None],
    ) -> None:
        """:meth:`claim` without waiting: ``done(result, None)`` or ``done(None,
        error)`` is called once it is over, by a goroutine of the runtime (possibly
        the caller, before this returns, for a refused argument). ``done`` must not
        block."""

    @abc.abstractmethod
    def complete_later(
        self,
        caller: str,
        key: str,
        fence: int,
        completion: Completion,
        done: Callable[[Record | None, BaseException | None], None],
    ) -> None:
        """:meth:`complete` without waiting, as :meth:`claim_later`."""


class OneStepStore(Store):
    """A store that can claim a key and complete it with an effect in one transaction
    (``SQLiteStore``, ``PostgresStore``): ``Idempotency.run(..., one_step=True)`` then
    costs one round trip and one commit instead of two, and no in-progress record is
    ever written (so a process killed mid-call leaves no claim to wait out).

    A store implements :meth:`claim_and_complete_later` (the one mechanism; a store that
    does not batch may run an async step in a goroutine of its own and hand its end to
    ``done`` with :func:`deliver`); :meth:`claim_and_complete` is the wait on it."""

    @abc.abstractmethod
    def claim_and_complete_later(
        self,
        caller: str,
        key: str,
        fingerprint: bytes,
        lease: float,
        call: Any,
        completion: Completion,
        done: Callable[[ClaimResult | Record | None, BaseException | None], None],
    ) -> None:
        """Apply ``_record.claim``; unless it claimed, its ClaimResult is the result and
        nothing changes. When it claimed: set ``call.fence`` to the claim's fencing
        token, run ``completion``'s effect and record its outcome, all in the
        transaction that takes the claim; the completed record is the result. If the
        effect raises anything but a final ApplicationError, nothing of the step is
        written (no claim either) and that exception is the error.

        Without waiting: ``done(result, None)`` or ``done(None, error)`` is called once
        it is over, by a goroutine of the runtime (``done`` must not block)."""

    def claim_and_complete(
        self,
        caller: str,
        key: str,
        fingerprint: bytes,
        lease: float,
        call: Any,
        completion: Completion,
    ) -> Coroutine[Any, Any, ClaimResult | Record]:
        """:meth:`claim_and_complete_later`, awaited: its result, or its error raised."""
        return await_done(
            self.claim_and_complete_later, caller, key, fingerprint, lease, call, completion
        )


async def deliver(step: Awaitable[Any], done: Callable[[Any, BaseException | None], None]) -> None:
    """Await ``step`` (in a goroutine of its own), then ``done(result, None)`` or
    ``done(None, error)``: how a store that does not batch makes an awaitable step its
    call-back form."""
    try:
        result = await step
    except Exception as exc:
        done(None, exc)
        return
    done(result, None)


def refused_on_virtual_clock(store: str, judge: str) -> RuntimeError | None:
    """Why ``store``, whose leases and retention ``judge`` (a clock of the real world)
    decides, cannot serve the running runtime, or None when it can: on a virtual clock
    a lease would not lapse in simulated time, so the same program would decide
    differently under real and virtual time. A store given a ``clock`` of its own is
    never asked (that clock judges: ``clock=lambda: base + gosim.now()`` follows the
    runtime's, virtual or not)."""
    if not lowlevel.virtual_clock():
        return None
    return RuntimeError(
        f"{store}: refused on a virtual clock: leases and retention are judged by"
        f" {judge}, which virtual time does not move (a lease would not lapse in"
        " simulated time); give the store a clock that follows the runtime's"
        " (clock=lambda: base + gosim.now()), or run on a real clock"
    )
