"""Group commit: concurrent goroutines' store operations share one transaction.

A durable commit costs an fsync (about 250 us here: SQLite in WAL mode with
``synchronous=FULL`` commits about 3,900 single-row transactions/s, and about 86,000
rows/s in transactions of 100). A Redis round trip costs a syscall hop and a network
exchange. Both costs are per batch, not per row, so operations that arrive while a
batch is being written wait and go together in the next one.

Protocol (one mechanism: the callback):

1. An operation comes with a callback, ``done(result, error)``
   (:meth:`GroupCommitter.submit_later`), and is appended to ``pending``. If no batch is
   in flight a **leader** goroutine is started; before every batch it yields
   (``gosched``), so that goroutines already runnable can append theirs.
2. The leader takes up to ``max_batch`` pending operations and hands them to the
   committer's own OS thread (the blocking store call runs there, so other goroutines
   keep running and keep appending), then parks on a ``Waiter`` that the thread
   settles through a ``gosim.lowlevel.ThreadWake`` when the batch is done: the settle
   is queued on the runtime and a driver blocked in the netpoller is woken by its
   break (one ``eventfd`` write), where ``gosim.syscall`` costs a trio task, a
   hand-off to trio's thread pool and a trio wake-up per batch (about 0.5M
   instructions a round trip, against 40k). ``apply_batch`` sets each operation's
   result or error and never raises for one operation's failure. A reproducible
   runtime (seeded, or on a virtual clock: ``gosim.lowlevel.reproducible``) runs the
   batch through ``gosim.syscall`` instead, inline on its driver. The thread ends
   after ``THREAD_IDLE`` seconds without a batch and is started again by the next one.
   A store whose I/O parks goroutines on the netpoller itself (``PostgresStore``)
   gives an async apply instead (``apply_async``): the leader awaits it, with no
   thread.
3. After the call returns -- the commit is durable -- the leader calls every
   operation's ``done``. Replies therefore leave only after their commit.
4. The leader goes on while operations are pending, then ends. No goroutine lives
   between batches: nothing to start or stop, and a store with no callers costs nothing.

:meth:`GroupCommitter.submit` is the awaiting form and nothing more: each :class:`Op`
is a ``gosim.lowlevel.Waiter``, which the leader settles when a caller is parked on
it; an operation with a callback (``done``, kept in the Op) is answered by the leader
calling it, with no settle in between. A callback costs a call where a waiting
goroutine costs its park, its wake and the resumption of every coroutine between it
and the committer; a caller that has nothing else to do pays only the park and the
wake.

Alternatives rejected: a committer goroutine per store (its lifetime would have to
follow runtimes that start and stop under the store, and its wake-up costs a switch per
batch), and a timer-based batch window (it adds latency when there is no concurrency;
here a lone call commits at once and batching grows exactly with the load).
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar, Final

import gosim
from gosim import go, lowlevel
from gosim.lowlevel import ThreadWake, Waiter, WaitReason

from .._accel import speedups as _speedups
from .._errors import CorruptedRecord, StaleClaim
from .._record import ClaimResult, Record, release, renew, state_at
from ._contract import (
    MAX_KEY_LENGTH,
    MAX_PAYLOAD_BYTES,
    CallbackStore,
    Completion,
    Effect,
    OneStepStore,
    StoreStatistics,
    bad_caller_or_key,
    bad_completion,
    bad_duration,
)

__all__ = [
    "THREAD_IDLE",
    "BatchedOneStepStore",
    "BatchedStore",
    "GroupCommitter",
    "Op",
    "OpKind",
    "WorkingSet",
    "apply_plain",
    "current",
    "raise_when_awaited",
]

_COMMIT_WAIT: Final = WaitReason.COMMIT_WAIT

THREAD_IDLE: Final = 5.0  # seconds without a batch before the committer's thread ends


class OpKind(enum.IntEnum):
    """What an :class:`Op` asks of its store's batch: one numbering for every store
    (each applies the kinds its wrappers submit)."""

    CLAIM = 0
    COMPLETE = 1  # a completion, with its effect where the store runs it in the batch
    RELEASE = 2
    GET = 3
    SWEEP = 4  # a whole sweep in the batch (SQLite: between batches on its one connection)
    TRANSACT = 5  # SQLiteStore.transact
    CLAIM_COMPLETE = 6  # claim_and_complete: a claim and its effect in one step
    RENEW = 7
    EFFECT = 8  # a completion with an effect the store runs apart (RedisStore's script)


# Enum members as module constants: a global read, not a class attribute lookup, per call.
_CLAIM: Final = OpKind.CLAIM
_COMPLETE: Final = OpKind.COMPLETE
_CLAIM_COMPLETE: Final = OpKind.CLAIM_COMPLETE

# The one place this module chooses C or Python: its C twins -- Op's constructor and
# the batched stores' callback forms -- stand in for their references
# where the accelerator is built and gosim's Waiter, Op's base, is its C type (which
# op_new allocates in one call). Each is bound where its reference is defined, from this
# flag alone; where it is False (GOSIM_PURE_PYTHON=1, no compiler) the definitions below
# are what runs.
_C_TWINS: Final = _speedups is not None and bool(_speedups.op_fits(Waiter))


class Op(Waiter):
    """One store operation in flight: what to do, and once done its result or error.

    Once its batch has committed it has its ``result`` or its ``error``, and the leader
    hands them to its one consumer: ``callback``, the ``done`` given to
    :meth:`GroupCommitter.submit_later`, called with both; or, where it is None, a
    caller parked in :meth:`GroupCommitter.submit` on the operation as a
    :class:`gosim.lowlevel.Waiter`, which the leader settles (with ``result``) or fails
    (with ``error``). A caller that leaves its wait by an exception cancels it, so the
    leader's settle wakes nobody.
    """

    __slots__ = ("args", "callback", "error", "kind", "result")

    if TYPE_CHECKING or not _C_TWINS:
        # A Waiter's constructor takes at most its ``data``: it is given none of this
        # class's arguments.
        def __new__(cls, kind: int, args: tuple[Any, ...]) -> Op:
            return Waiter.__new__(cls)

        def __init__(self, kind: int, args: tuple[Any, ...]) -> None:
            super().__init__()
            self.kind = kind
            self.args = args
            self.callback: Callable[[Any, BaseException | None], None] | None = None
            self.result: Any = None
            self.error: BaseException | None = None

    else:
        # The twin of both in one C call (about 5,000 instructions less an operation);
        # the __init__ inherited from the C Waiter then takes the arguments and does
        # nothing.
        __new__ = staticmethod(_speedups.op_new)


# Op's slots for every C function that reads or builds an Op: op_new and the submit
# twins here, and SQLiteStore's batch work, which runs wherever the accelerator
# does (even where op_new does not stand in: it reads Ops, it does not build them).
if _speedups is not None:
    _speedups.configure_op(Op)


WorkingSet = dict[tuple[str, str], Record | CorruptedRecord | None]
"""A batch's records by (caller, key), as its rows were read: a record, None (no row),
or the error saying how the row is damaged."""


def current(ws: WorkingSet, rk: tuple[str, str]) -> Record | None:
    """The working set's record of ``rk``; raises the CorruptedRecord its row was."""
    rec = ws[rk]
    if isinstance(rec, CorruptedRecord):
        raise rec
    return rec


def apply_plain(
    op: Op, ws: WorkingSet, dirty: dict[tuple[str, str], Record | None], now: float
) -> None:
    """Apply a RELEASE, GET or RENEW ``op`` to the working set, as every batched store
    does: set its result, note a changed record in ``dirty``; raises the operation's own
    error (a stale renewal, a damaged row) with the working set unchanged."""
    kind = op.kind
    if kind == OpKind.GET:
        rec = current(ws, (op.args[0], op.args[1]))
        op.result = rec if state_at(rec, now) else None
    elif kind == OpKind.RELEASE:
        caller, key, f = op.args
        rk = (caller, key)
        try:
            release(current(ws, rk), f, now, caller, key)
        except StaleClaim:
            op.result = False
        else:
            ws[rk] = dirty[rk] = None
            op.result = True
    else:
        assert kind == OpKind.RENEW, kind
        caller, key, f, lease = op.args
        rk = (caller, key)
        done = renew(current(ws, rk), f, now, lease, caller, key)
        ws[rk] = dirty[rk] = done
        op.result = done


def _serves_every_runtime() -> None:
    """A GroupCommitter's ``refused`` when it was given none."""
    return None


class GroupCommitter:
    """Runs operations in batches through ``apply_batch`` (see the module docstring).

    ``apply_batch(ops)`` runs on an OS thread and must set ``op.result`` or ``op.error``
    for each op; a lock keeps batches one at a time even when a runtime was torn down
    while a batch was still running on its thread.

    ``apply_async`` instead of ``apply_batch``: the async apply mode, for a store whose
    I/O parks goroutines on the netpoller itself (``PostgresStore``): the leader
    goroutine awaits ``apply_async(ops)`` (same duty: every op's result or error), with
    no thread. Batches are one at a time there too: a runtime
    has one leader.

    ``refused``: asked when a runtime queues its first operation (what it answers holds
    for the runtime: see :func:`refused_on_virtual_clock`); on a runtime it refuses, it
    is asked again before every batch, in the leader goroutine, and the exception it
    returns fails every operation of the batch, which is not applied.
    """

    def __init__(
        self,
        apply_batch: Callable[[list[Op]], None] | None,
        max_batch: int,
        *,
        apply_async: Callable[[list[Op]], Awaitable[None]] | None = None,
        refused: Callable[[], BaseException | None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        if (apply_batch is None) == (apply_async is None):
            raise ValueError("GroupCommitter: give apply_batch or apply_async, one of them")
        self.max_batch = max_batch
        self._apply_batch = apply_batch
        self._apply_async = apply_async
        self._refused = refused if refused is not None else _serves_every_runtime
        self._refuses = False  # what ``refused`` answered for ``_rt``: an exception
        self._thread_lock = threading.Lock()
        self._pending: list[Op] = []
        # Invariant: True exactly while a leader goroutine of ``_rt`` runs (it takes
        # every operation appended to ``_pending`` before it ends).
        self._leading = False
        self._rt: Any = None  # the runtime of the pending ops (lowlevel.current_runtime())
        # Whether this runtime's batches run on the committer's thread (else through
        # gosim.syscall: a reproducible runtime; or apply_async).
        self._on_thread = False
        # The thread's work: a batch and the leader's wake, settled with None or the
        # exception apply_batch raised as a whole.
        self._work: queue.SimpleQueue[tuple[list[Op], ThreadWake]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_state = threading.Lock()  # _thread's start and end vs. new work
        self.operations = 0
        self.batches = 0
        self.largest_batch = 0

    def _run(self, batch: list[Op]) -> None:
        assert self._apply_batch is not None
        with self._thread_lock:
            self._apply_batch(batch)

    def submit_later(self, op: Op, done: Callable[[Any, BaseException | None], None]) -> None:
        """Run ``op`` in the next batch without waiting for it: ``done(result, error)``
        is called once its batch has committed, by the goroutine that led the batch.

        ``done`` must not block and should not raise: an exception from it is a panic
        of a goroutine of its own, once the batch's other operations have their
        results."""
        op.callback = done
        self._enqueue(op)

    def _enqueue(self, op: Op) -> None:
        """Queue ``op`` for the next batch, starting a leader if none runs."""
        rt = lowlevel.current_runtime()  # raises NotInRuntime
        if self._rt is not rt:
            # A new runtime: whatever the last one left (a leader closed mid-batch when
            # its runtime ended) is gone with its goroutines.
            self._rt = rt
            self._pending = []
            self._leading = False
            # Asked once a runtime (its clock is the runtime's to the end), so that a
            # batch on a runtime the store serves costs no call.
            self._refuses = self._refused() is not None
            self._on_thread = self._apply_async is None and not lowlevel.reproducible()
        self._pending.append(op)
        if not self._leading:
            self._leading = True
            go(self._lead)

    def _put(self, item: tuple[list[Op], ThreadWake]) -> None:
        with self._thread_state:
            self._work.put(item)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name=f"group commit {id(self):x}", daemon=True
                )
                self._thread.start()

    def _serve(self) -> None:
        """The committer's thread: apply each batch handed over, then wake its leader."""
        work = self._work
        while True:
            try:
                batch, wake = work.get(timeout=THREAD_IDLE)
            except queue.Empty:
                with self._thread_state:
                    if work.empty():  # else a batch came just now: serve it
                        self._thread = None
                        return
                continue
            error: BaseException | None = None
            try:
                self._run(batch)
            except BaseException as exc:  # apply_batch failed as a whole: the leader's
                error = exc
            wake.settle(error)
            # The leader's now: nothing of the batch (its calls, its runtime) is kept
            # alive by this thread while it waits for the next.
            del batch, wake, error

    async def submit(self, op: Op) -> Any:
        """Run ``op`` in the next batch; awaited, its result or its error raised (the
        caller parks as ``idempotency commit``). Nothing is queued until it is awaited."""
        self._enqueue(op)
        return await op.wait(_COMMIT_WAIT)

    async def _lead(self) -> None:
        """Lead batches until nothing is pending (see the module docstring)."""
        pending = self._pending
        try:
            while True:
                # Before every batch, let the goroutines that are runnable now (typically
                # the callers just answered with the last batch's replies) add their
                # operations first: without this yield batches would alternate between
                # a few and all the rest.
                await gosim.gosched()
                if not pending:
                    return
                await self._commit(pending)
        finally:
            if pending is self._pending:  # not a runtime that replaced it
                self._leading = False

    async def _commit(self, pending: list[Op]) -> None:
        """Take a batch from ``pending``, apply it, and call every operation's ``done``."""
        batch = pending[: self.max_batch]
        del pending[: len(batch)]
        try:
            if self._refuses and (refusal := self._refused()) is not None:
                for o in batch:
                    o.result, o.error = None, refusal
            elif self._on_thread:
                done = Waiter()
                self._put((batch, ThreadWake(done)))
                error = await done.wait(_COMMIT_WAIT)
                if error is not None:
                    raise error
            elif self._apply_async is not None:
                await self._apply_async(batch)
            else:  # a reproducible runtime
                await gosim.syscall(self._run, batch)
        except Exception as exc:  # apply_batch failed as a whole (a bug): tell all
            for o in batch:
                if o.error is None:
                    o.error = exc
        self.operations += len(batch)
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        failed: list[BaseException] = []
        for o in batch:
            try:
                callback = o.callback
                if callback is not None:  # submit_later's consumer
                    callback(o.result, o.error)
                elif o.error is None:  # a caller parked in submit
                    o.settle(o.result)
                else:
                    o.fail(o.error)
            except BaseException as bug:
                # A callback's bug, or a handler's BaseException (a two-step call runs its
                # handler in the claim's callback): raised after the others have their
                # results, never instead of them.
                failed.append(bug)
        for error in failed:
            go(_reraise, error)


class _PyCallbackForms(CallbackStore):
    """The Python reference of BatchedStore's callback forms, ``claim_later`` and
    ``complete_later``: the arguments checked (a refused one fails its call alone,
    before it joins a batch), the :class:`Op` submitted to the store's committer.

    BatchedStore binds their C twins over them where this module chooses C
    (``_C_TWINS``); the twins take the common case and hand every other one back here.
    """

    _effect_type: ClassVar[type[Effect]]
    _effect_kind: ClassVar[OpKind] = OpKind.COMPLETE
    _committer: GroupCommitter

    def claim_later(
        self,
        caller: str,
        key: str,
        fingerprint: bytes,
        lease: float,
        done: Callable[[ClaimResult | None, BaseException | None], None],
    ) -> None:
        bad = self._bad_claim(caller, key, lease)
        if bad is not None:
            done(None, bad)
            return
        self._committer.submit_later(Op(_CLAIM, (caller, key, fingerprint, lease)), done)

    def complete_later(
        self,
        caller: str,
        key: str,
        fence: int,
        completion: Completion,
        done: Callable[[Record | None, BaseException | None], None],
    ) -> None:
        bad = bad_completion(self, caller, key, completion) or self._foreign(completion)
        if bad is not None:
            done(None, bad)
            return
        kind = _COMPLETE if completion.effect is None else self._effect_kind
        self._committer.submit_later(Op(kind, (caller, key, fence, completion)), done)

    def _bad_claim(self, caller: str, key: str, lease: float) -> Exception | None:
        """A claim's arguments the store cannot take, named (else None)."""
        bad = bad_duration(self, "claim", caller, key, "lease", lease)
        return bad or bad_caller_or_key(self, "claim", caller, key)

    def _foreign(self, completion: Completion) -> TypeError | None:
        """The error for an effect of another store's kind (else None)."""
        effect = completion.effect
        if effect is not None and not isinstance(effect, self._effect_type):
            return TypeError(f"{type(self).__name__} cannot run a {type(effect).__name__}")
        return None


class _PyOneStepForm(_PyCallbackForms, OneStepStore):
    """The Python reference of BatchedOneStepStore's ``claim_and_complete_later``: its
    arguments checked as :meth:`_bad_step` says, the CLAIM_COMPLETE :class:`Op`
    submitted. BatchedOneStepStore binds its C twin over it where this module chooses
    C, as BatchedStore does for the other two."""

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
        bad = self._bad_step(caller, key, lease, completion)
        if bad is not None:
            done(None, bad)
            return
        op = Op(_CLAIM_COMPLETE, (caller, key, fingerprint, lease, call, completion))
        self._committer.submit_later(op, done)

    def _bad_step(
        self, caller: str, key: str, lease: float, completion: Completion
    ) -> Exception | None:
        """claim_and_complete's arguments the store cannot take, named (else None)."""
        bad = self._bad_claim(caller, key, lease)
        return bad or bad_completion(self, caller, key, completion) or self._foreign(completion)


# The C twins of the three callback forms above: one C call each for the common case
# (arguments the references' checks pass, the Op, submit_later's common case), handed
# the references for every other case. BatchedStore and BatchedOneStepStore bind them.
if _C_TWINS:
    _speedups.configure_submit(
        claim_later=_PyCallbackForms.claim_later,
        complete_later=_PyCallbackForms.complete_later,
        claim_and_complete_later=_PyOneStepForm.claim_and_complete_later,
        claim=_CLAIM,
        complete=_COMPLETE,
        claim_complete=_CLAIM_COMPLETE,
        completion=Completion,
        max_key_length=MAX_KEY_LENGTH,
        max_payload_bytes=MAX_PAYLOAD_BYTES,
        current_runtime=lowlevel.current_runtime,
    )


class BatchedStore(_PyCallbackForms):
    """A store whose operations go through a :class:`GroupCommitter`: the contract's
    methods written once -- their argument checks (a refused argument fails its call
    alone, at the await, before it joins a batch), the :class:`Op` each submits, the
    statistics and the close -- so that a store holds only what differs: its
    ``_apply_batch`` (or ``apply_async``), ``sweep``, ``_close``, and the operator's
    ``inspect`` and ``forget`` where it has them.

    A subclass sets ``_committer`` and ``_clock`` (None: this machine's clock) in its
    constructor, and ``_effect_type``: the :class:`Effect` it runs (another is refused
    with TypeError). ``_effect_kind`` is the kind of a completion with an effect.
    """

    _clock: Callable[[], float] | None

    if not TYPE_CHECKING and _C_TWINS:  # else _PyCallbackForms' own
        claim_later = _speedups.as_method(_speedups.claim_later)
        complete_later = _speedups.as_method(_speedups.complete_later)

    # claim and complete, the waits on the same Op (a Waiter), return the committer's
    # coroutine rather than being coroutines themselves: one coroutine fewer an operation.
    def claim(
        self, caller: str, key: str, fingerprint: bytes, lease: float
    ) -> Coroutine[Any, Any, ClaimResult]:
        if (bad := self._bad_claim(caller, key, lease)) is not None:
            return raise_when_awaited(bad)
        return self._committer.submit(Op(OpKind.CLAIM, (caller, key, fingerprint, lease)))

    def complete(
        self, caller: str, key: str, fence: int, completion: Completion
    ) -> Coroutine[Any, Any, Record]:
        bad = bad_completion(self, caller, key, completion) or self._foreign(completion)
        if bad is not None:
            return raise_when_awaited(bad)
        kind = OpKind.COMPLETE if completion.effect is None else self._effect_kind
        return self._committer.submit(Op(kind, (caller, key, fence, completion)))

    async def release(self, caller: str, key: str, fence: int) -> bool:
        return await self._committer.submit(Op(OpKind.RELEASE, (caller, key, fence)))  # type: ignore[no-any-return]

    async def renew(self, caller: str, key: str, fence: int, lease: float) -> Record:
        if (bad := bad_duration(self, "renewal", caller, key, "lease", lease)) is not None:
            raise bad
        return await self._committer.submit(Op(OpKind.RENEW, (caller, key, fence, lease)))  # type: ignore[no-any-return]

    async def get(self, caller: str, key: str) -> Record | None:
        return await self._committer.submit(Op(OpKind.GET, (caller, key)))  # type: ignore[no-any-return]

    def now(self) -> float:
        """The clock given to the store, else this machine's (for a store whose server
        keeps the time, an estimate of it: used only to time waits, never to decide a
        record's state)."""
        return self._clock() if self._clock is not None else time.time()

    def statistics(self) -> StoreStatistics:
        c = self._committer
        return StoreStatistics(c.operations, c.batches, c.largest_batch)

    def close(self) -> None:
        with self._committer._thread_lock:  # not while a batch runs on its thread
            self._close()

    def _close(self) -> None:
        """Release what the store holds (between batches)."""


class BatchedOneStepStore(BatchedStore, _PyOneStepForm):
    """A :class:`BatchedStore` whose batch also applies ``claim_and_complete``
    (:data:`OpKind.CLAIM_COMPLETE`): a claim and its effect in one transaction."""

    if not TYPE_CHECKING and _C_TWINS:  # else _PyOneStepForm's own
        claim_and_complete_later = _speedups.as_method(_speedups.claim_and_complete_later)

    def claim_and_complete(
        self,
        caller: str,
        key: str,
        fingerprint: bytes,
        lease: float,
        call: Any,
        completion: Completion,
    ) -> Coroutine[Any, Any, ClaimResult | Record]:
        bad = self._bad_step(caller, key, lease, completion)
        if bad is not None:
            return raise_when_awaited(bad)
        return self._committer.submit(
            Op(OpKind.CLAIM_COMPLETE, (caller, key, fingerprint, lease, call, completion))
        )


async def _reraise(exc: BaseException) -> None:
    raise exc


async def raise_when_awaited(exc: Exception) -> Any:
    """An awaitable that raises ``exc`` when awaited: what a store method that returns
    the committer's coroutine (rather than being a coroutine itself, one frame fewer an
    operation) returns for a refusal, so the error comes at the await as before."""
    raise exc
