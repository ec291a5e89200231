"""``Idempotency``: run a request once per key, record its outcome, replay it after.

The flow of :meth:`Idempotency.run`, fast path first:

1. Validate the key and caller, fingerprint the request (``_keys``).
2. **Claim** the key in the store (``_record.claim`` applied atomically).
   - CLAIMED: this call holds the key with a new fencing token; go to 3.
   - REPLAY: a completed record with the same fingerprint; return its outcome with
     ``replayed=True``. The handler does not run.
   - MISMATCH: the key is live for another request: :class:`KeyReused`.
   - BUSY: another execution holds the key. With ``wait=False``: :class:`InProgress`.
     Otherwise wait -- woken at once when the holder is in this process (a channel per
     key, closed when the holder finishes), else by a poll timer backing off from 2 ms
     to 100 ms -- and claim again, until this call's own timeout or context ends. A
     holder that died is taken over by the claim after its lease lapses.
3. Run the handler with a :class:`Call` (caller, key, operation, args, fence, ctx).
   While it runs, the claim is kept alive: one goroutine per ``Idempotency`` (started
   with the first claim, gone at its first tick with no claim held) renews every claim
   this process has held for a whole tick, every ``lease / 4``, fenced by the claim's
   token. A slow handler keeps its key; a holder that died stops renewing, and its
   claim lapses within a lease.
4. Record the outcome: the return value, or a final :class:`ApplicationError`, or the
   result of the :class:`~idempotency.stores.Effect` the handler returned (run by the
   store inside the transaction that completes the record). A retryable error, any other
   exception, or an outcome that cannot be recorded releases the claim instead, and the
   exception propagates: a retry runs the handler again. (An effect the store cannot
   undo, once it has written, is recorded whatever follows: see InvalidResult.)

With ``one_step=True`` (a handler that only builds its outcome, at once) on a store that
can (a OneStepStore: SQLite, PostgreSQL), steps 2-4 are one store operation: the handler
runs first, with ``call.fence`` set only when its effect runs, and the claim, the effect
and the record commit in one transaction (a replay or a mismatch drops what the handler
built; a busy key is waited for as above). No claim is committed apart from its record,
so a holder killed mid-call leaves no claim to wait out. :meth:`Idempotency.run_later` is
that step's one mechanism, a callback the store's batch calls once the commit returned;
``run`` with ``one_step=True`` is a wait on it.

The two steps have one mechanism too, on every store of the package: call-backs. On a
``SynchronousStore`` (memory) the claim, a handler that returns at once and the record
run in the caller's frame; on a ``CallbackStore`` (the batched stores) the handler runs
in the claim's callback and ``done`` in the record's, so the call waits on no
goroutine. Only what must wait gets one: a busy key, a handler's awaitable, a release.
``run`` is the wait on it; a store with only the ``Store`` contract's coroutines (an
application's own) is awaited step by step instead.

Guarantees: the handler runs at most once per *live claim*, and a claim stays live while
its holder lives (renewed; it lapses when the holder has been dead or cut off from the
store for a lease); a key's outcome, once
recorded, is the only one it ever has until its TTL passes. An effect returned as an
Effect happens exactly once with its record (both or neither, whatever crashes); an
effect the handler does itself happens at least once, fenced by ``call.fence``.

Alternatives rejected: answering every duplicate with InProgress (the draft's 409, and
what Stripe and Powertools do: the client must poll; here ``wait=False`` keeps it);
Redis pub/sub or SQLite update hooks to wake waiters in other processes (a connection or
a hook per process for a case that polling bounded at 100 ms serves); re-running the
handler of a duplicate whose first execution is still live (that is the bug this layer
exists to prevent).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeAlias

import gosim
from gosim import Chan, context, go, lowlevel, recv, select

from ._accel import speedups as _speedups
from ._errors import (
    ApplicationError,
    InProgress,
    InvalidRequest,
    InvalidResult,
    KeyReused,
    StaleClaim,
    StoreError,
)
from ._keys import (
    DEFAULT_MAX_ARGS_BYTES,
    MAX_KEY_LENGTH,
    fingerprint,
    validate_caller,
    validate_key,
)
from ._outcome import _NOT_DECODED, DEFAULT_MAX_RESULT_BYTES, Outcome, encode_error, encode_result
from ._outcome import _packb as _outcome_packb
from ._record import ClaimKind, ClaimResult, Record
from ._waiter import await_done
from .stores import (
    MAX_PAYLOAD_BYTES,
    CallbackStore,
    Completion,
    Effect,
    OneStepStore,
    Store,
    SynchronousStore,
    deliver,
    new_completion,
)

__all__ = ["DEFAULT_LEASE", "DEFAULT_TTL", "Call", "Handler", "Idempotency"]

DEFAULT_TTL: Final = 24 * 3600.0  # completed records are kept a day (Stripe, Powertools)
DEFAULT_LEASE: Final = 60.0  # a claim lapses this long after it was taken
POLL_MIN: Final = 0.002
POLL_MAX: Final = 0.1

_CLAIMED: Final = ClaimKind.CLAIMED
_REPLAY: Final = ClaimKind.REPLAY
_MISMATCH: Final = ClaimKind.MISMATCH


class Call:
    """What a handler is given: the request, and the claim it runs under.

    ``fence`` is the claim's fencing token: higher for every later claim of any key in
    the store. Pass it to external systems so they can refuse writes from an execution
    that has been superseded. ``ctx`` is the caller's :mod:`gosim.context`, if any.
    """

    __slots__ = ("args", "caller", "ctx", "fence", "key", "operation")

    def __init__(
        self,
        caller: str,
        key: str,
        operation: str,
        args: Any,
        fence: int,
        ctx: context.Context | None,
    ) -> None:
        self.caller = caller
        self.key = key
        self.operation = operation
        self.args = args
        self.fence = fence
        self.ctx = ctx

    def __repr__(self) -> str:
        return f"<Call {self.operation} caller={self.caller!r} key={self.key!r} fence={self.fence}>"


Handler: TypeAlias = Callable[[Call], Any | Awaitable[Any]]


def _refuse_awaitable(result: Any) -> None:
    """A one-step handler returned an awaitable: close it (never to be awaited), refuse."""
    close = getattr(result, "close", None)
    if close is not None:
        close()
    raise TypeError(f"a one-step handler returns at once, not {type(result).__name__}")


def _checked(
    caller: str, key: str, request: tuple[str, Any], max_args_bytes: int
) -> tuple[str, str, str, Any, bytes]:
    """Check the key, the caller and the request (raising what says why); return the
    caller and the key as plain strs (a str subclass becomes the str it holds, which is
    what the store keeps), the operation, its arguments and the request's fingerprint."""
    if (
        not (type(key) is str and 0 < len(key) <= MAX_KEY_LENGTH and key.isascii())
        or not key.isprintable()
    ):
        key = validate_key(key)  # raises InvalidKey, saying why
    if not (type(caller) is str and 0 < len(caller) <= MAX_KEY_LENGTH and caller.isprintable()):
        caller = validate_caller(caller)
    if type(request) is not tuple or len(request) != 2:
        raise InvalidRequest(f"request must be a pair (operation, args), not {request!r:.60}")
    operation, args = request
    return caller, key, operation, args, fingerprint(operation, args, max_args_bytes)


def _one_step_outcome(out: ClaimResult | Record) -> Outcome | None:
    """The outcome of a one-step store operation that claimed and completed, or found a
    replay; None when the key was busy or live for another request."""
    if isinstance(out, Record):  # claimed and completed
        assert out.payload is not None
        return Outcome(out.ok, out.payload, False, out.fence)
    if out.kind is _REPLAY:
        rec = out.record
        assert rec.payload is not None
        return Outcome(rec.ok, rec.payload, True, rec.fence)
    return None


class Idempotency:
    """Idempotent execution of requests over a :class:`~idempotency.stores.Store`.

    ``ttl``: how long a completed outcome is replayed (default 24 h); after it, the key is
    new again. ``lease``: how long a claim holds without word from its holder (default
    60 s). While a handler runs, its claim is renewed every ``lease / 4`` (fenced, from
    this process), so the lease bounds how long the key stays held by a holder that
    died, not how long a handler may run. Should renewals fail for a whole lease (the
    store unreachable, the process stalled), another execution may take the key over,
    and this one's completion is refused with :class:`StaleClaim`. ``math.inf`` (for
    ``ttl`` or ``lease``) never expires, on every store. ``wait``: the default for
    :meth:`run`.
    ``max_args_bytes`` / ``max_result_bytes`` bound the encoded request and outcome;
    ``max_result_bytes`` may be at most ``stores.MAX_PAYLOAD_BYTES`` (256 MiB), the
    largest outcome every store records (ValueError at construction else).
    """

    def __init__(
        self,
        store: Store,
        *,
        ttl: float = DEFAULT_TTL,
        lease: float = DEFAULT_LEASE,
        wait: bool = True,
        max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        if not ttl > 0 or not lease > 0:
            raise ValueError(f"ttl and lease must be positive, not {ttl!r} and {lease!r}")
        if not (
            isinstance(max_result_bytes, (int, float)) and max_result_bytes <= MAX_PAYLOAD_BYTES
        ):  # NaN is not: it would let every outcome through
            raise ValueError(
                f"max_result_bytes must be a number of at most {MAX_PAYLOAD_BYTES} bytes"
                " (stores.MAX_PAYLOAD_BYTES: the largest outcome every store records,"
                f" within Redis' and PostgreSQL's limits), not {max_result_bytes!r}"
            )
        self._store = store
        # A store whose operations never wait is called without a coroutine per operation.
        self._sync_store = store if isinstance(store, SynchronousStore) else None
        # A store whose claims and completions call back (the batched stores): a call
        # whose handler returns at once waits on no goroutine.
        self._callback_store = store if isinstance(store, CallbackStore) else None
        # A store that claims and completes in one transaction (run(..., one_step=True)).
        self._one_step_store = store if isinstance(store, OneStepStore) else None
        self.ttl = ttl
        self.lease = lease
        self.wait = wait
        self.max_args_bytes = max_args_bytes
        self.max_result_bytes = max_result_bytes
        # Keys whose holder runs in this process and that someone waits for: the holder
        # closes the channel when it finishes (completes or releases).
        self._waiters: dict[tuple[str, str], Chan[None]] = {}
        # Keys held by executions in this process, with their fence: a waiter here
        # sleeps until the holder finishes (or a whole lease passes, in case it overruns
        # its lease) instead of polling the store. No clock is read on the fast path.
        # The keep-alive renews the claims it finds here on two ticks in a row.
        self._holders: dict[tuple[str, str], int] = {}
        # The runtime whose keep-alive goroutine runs now (None: none runs); False once
        # the store said it cannot renew.
        self._keeper: Any = None

    @property
    def store(self) -> Store:
        """The store, fixed at construction."""
        return self._store

    async def run(
        self,
        *,
        caller: str,
        key: str,
        request: tuple[str, Any],
        handler: Handler,
        wait: bool | None = None,
        timeout: float | None = None,
        ctx: context.Context | None = None,
        one_step: bool = False,
    ) -> Outcome:
        """Run ``handler`` for ``request`` once per (caller, key); see the module docstring.

        ``one_step=True`` says that the handler does nothing but return: an
        :class:`~idempotency.stores.Effect` (or a value, or a final ApplicationError)
        built from its :class:`Call`, at once (no awaitable). On a store that can
        (:class:`~idempotency.stores.OneStepStore`: ``SQLiteStore``,
        ``PostgresStore``), the handler then runs before the claim, and the claim, the
        effect and the record commit in one transaction: one round trip and one commit
        instead of two, and no in-progress record, so a process killed mid-call leaves
        its key free (or completed), never claimed until a lease lapses. (A key found
        held by another execution is waited for as usual; a claim taken over from a
        lapsed holder is then completed in a second transaction.) ``call.fence`` is set
        only when the effect runs (read it in the effect, not in the handler), and the
        handler also runs for a call that turns out to be a replay (its effect is then
        dropped). On other stores (Redis, memory) it is the usual path.

        ``one_step`` stays a promise the caller makes, not a guess from the handler's
        type: a plain function that returns at once may still act outside the store
        (send a message), and run first it would act for every replay and every
        duplicate, before any claim, with no fence to hand on (``call.fence`` is 0
        until the effect runs). Only the caller knows its handler builds an outcome and
        nothing more. Without the promise the default path still pays one fsync a
        call, not two: on SQLite the claim's transaction commits without an fsync of
        its own (``synchronous=NORMAL``; see ``SQLiteStore``'s "Durability": a claim
        lost to an OS crash only lets a retry run the handler again, the at-least-once
        this path promises for outside effects anyway, and fences never go back), and
        the completion's fsync, shared by its batch, makes it durable.

        The call goes on without its caller: on the project's stores the claim, the
        handler and the record are steps of the store's batches (a plain handler runs
        in the claim's callback, an async one in a goroutine of its own), so a caller
        that leaves this wait (cancelled) leaves the call to run to its record, which a
        retry with the same key replays or waits for.

        Returns the :class:`Outcome` (``replayed`` tells a replay). Raises
        :class:`InvalidKey`, :class:`InvalidRequest`, :class:`KeyReused`,
        :class:`InProgress` (busy and ``wait`` is False, or ``timeout`` passed while
        waiting), the context's error when ``ctx`` ends while waiting,
        :class:`StaleClaim`, :class:`InvalidResult`, a store error, or what the handler
        raised when it was not a final ApplicationError.
        """
        caller, key, operation, args, fp = _checked(caller, key, request, self.max_args_bytes)
        if one_step and self._one_step_store is not None:
            # The wait on run_later's mechanism: the store's batch settles it.
            return await await_done(  # type: ignore[no-any-return]
                self._one_step,
                caller,
                key,
                operation,
                args,
                fp,
                handler,
                self.wait if wait is None else wait,
                timeout,
                ctx,
            )
        if self._sync_store is not None or self._callback_store is not None:
            # The wait on the two-step callback mechanism (_two_step): on a store whose
            # operations never wait, a plain handler's call is over before it returns.
            return await await_done(  # type: ignore[no-any-return]
                self._two_step, caller, key, operation, args, fp, handler,
                self.wait if wait is None else wait, timeout, ctx, one_step,
            )  # fmt: skip
        store = self._store
        res = await store.claim(caller, key, fp, self.lease)
        if res.kind is not _CLAIMED:
            if res.kind is _REPLAY:
                rec = res.record
                assert rec.payload is not None
                return Outcome(rec.ok, rec.payload, True, rec.fence)
            settled = await self._settle(
                res, caller, key, fp, self.wait if wait is None else wait, timeout, ctx
            )
            if type(settled) is Outcome:
                return settled
            res = settled  # type: ignore[assignment]
        fence = res.record.fence
        rk = (caller, key)
        holders = self._holders
        holders[rk] = fence
        if self._keeper is not False and self._keeper is not lowlevel.current_runtime():
            self._start_keeper()
        max_bytes = self.max_result_bytes
        try:
            result = handler(Call(caller, key, operation, args, fence, ctx))
            if hasattr(result, "__await__"):
                if one_step:
                    _refuse_awaitable(result)  # the same promise on every store
                result = await result
            if isinstance(result, Effect):
                completion = new_completion(Completion, (True, None, result, self.ttl, max_bytes))
            else:
                payload = encode_result(result, max_bytes)
                completion = new_completion(Completion, (True, payload, None, self.ttl, max_bytes))
        except ApplicationError as err:
            if err.retryable:
                await self._release(caller, key, fence)
                raise
            try:
                payload = encode_error(err, max_bytes)
            except InvalidResult:
                await self._release(caller, key, fence)
                raise
            completion = Completion(False, payload, None, self.ttl, max_bytes)
        except Exception:
            await self._release(caller, key, fence)
            raise
        try:
            rec = await store.complete(caller, key, fence, completion)
        except StaleClaim:
            raise
        except Exception:
            # The effect failed or could not be recorded, or the store failed: nothing
            # was recorded; free the key so a retry need not wait for the lease.
            await self._release(caller, key, fence)
            raise
        finally:
            # _finish, inlined: this runs on every call.
            if holders.get(rk) == fence:
                del holders[rk]
            if self._waiters:
                self._wake(rk)
        assert rec.payload is not None
        return Outcome(rec.ok, rec.payload, False, fence)

    def run_later(
        self,
        done: Callable[[Outcome | None, BaseException | None], None],
        *,
        caller: str,
        key: str,
        request: tuple[str, Any],
        handler: Handler,
        wait: bool | None = None,
        timeout: float | None = None,
        ctx: context.Context | None = None,
        one_step: bool = False,
    ) -> None:
        """:meth:`run`, without waiting for it: once it is over, ``done(outcome, None)``
        or ``done(None, error)`` is called with what ``run`` would have returned or
        raised, by a goroutine of the runtime -- possibly the caller, before
        ``run_later`` returns.

        The key and the request are checked now, in the caller: what that raises,
        ``run_later`` raises, and ``done`` is then never called; otherwise it is called
        exactly once. ``one_step`` is :meth:`run`'s promise, with ``run``'s default
        (False). With ``one_step=True`` on a OneStepStore the handler runs now too
        (what it raises, ``run_later`` raises), and no goroutine waits for the commit:
        the store calls back from its batch (a busy key, which must be waited for, gets
        a goroutine then). Two-step (the default, or any call on a store that cannot
        take one step) on a SynchronousStore: the claim is taken now and a handler that
        returns at once runs now, its outcome recorded before ``run_later`` returns; on
        a CallbackStore the claim's batch calls back, the handler runs there and the
        record's batch calls back with the outcome; a busy key, a handler's awaitable,
        or a failure that must release the claim gets a goroutine for the rest, and the
        handler's exceptions go to ``done``. On other stores ``run`` runs in a goroutine of its
        own, the handler with it. ``done`` must not block and should not raise (an
        exception from it is a panic, or ``run_later``'s when called in the caller).
        """
        caller, key, operation, args, fp = _checked(caller, key, request, self.max_args_bytes)
        wait = self.wait if wait is None else wait
        if one_step and self._one_step_store is not None:
            self._one_step(caller, key, operation, args, fp, handler, wait, timeout, ctx, done)
        elif self._sync_store is not None or self._callback_store is not None:
            self._two_step(
                caller, key, operation, args, fp, handler, wait, timeout, ctx, one_step, done
            )
        else:
            step = self.run(
                caller=caller, key=key, request=request, handler=handler, wait=wait,
                timeout=timeout, ctx=ctx, one_step=one_step,
            )  # fmt: skip
            go(deliver, step, done)

    def _two_step(
        self,
        caller: str,
        key: str,
        operation: str,
        args: Any,
        fp: bytes,
        handler: Handler,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
        one_step: bool,
        done: Callable[[Outcome | None, BaseException | None], None],
    ) -> None:
        """The one mechanism of a two-step call on a SynchronousStore or a
        CallbackStore (``run`` waits on it, ``run_later`` calls it): the claim, then in
        its callback the handler, then the record, then ``done`` -- in the caller's
        frame on a store that never waits, else in the callbacks of the store's
        batches; a goroutine only for what must wait (a busy key, an awaitable
        handler, a release)."""
        go_on = _continuation(
            self, caller, key, operation, args, fp, handler, wait, timeout, ctx, one_step, done
        )
        sync = self._sync_store
        if sync is not None:
            go_on(sync.claim_sync(caller, key, fp, self.lease), None)
            return
        store = self._callback_store
        assert store is not None
        store.claim_later(caller, key, fp, self.lease, go_on)

    def _on_claim(
        self,
        caller: str,
        key: str,
        operation: str,
        args: Any,
        fp: bytes,
        handler: Handler,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
        one_step: bool,
        done: Callable[[Outcome | None, BaseException | None], None],
        res: ClaimResult | None,
        error: BaseException | None,
    ) -> None:
        """A two-step call's claim is over: run the call on, or report."""
        if error is not None:
            done(None, error)
            return
        assert res is not None
        kind = res.kind
        if kind is _CLAIMED:
            self._claimed(
                res.record.fence, caller, key, operation, args, handler, ctx, one_step, done
            )
        elif kind is _REPLAY:
            rec = res.record
            assert rec.payload is not None
            done(Outcome(rec.ok, rec.payload, True, rec.fence), None)
        else:
            rest = self._two_step_rest(
                res, caller, key, operation, args, fp, handler, wait, timeout, ctx, one_step
            )
            go(deliver, rest, done)

    async def _two_step_rest(
        self,
        res: ClaimResult,
        caller: str,
        key: str,
        operation: str,
        args: Any,
        fp: bytes,
        handler: Handler,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
        one_step: bool,
    ) -> Outcome:
        """A two-step call whose claim found the key busy or live for another request:
        settle it (waiting), then, claimed, the rest of the call."""
        settled = await self._settle(res, caller, key, fp, wait, timeout, ctx)
        if type(settled) is Outcome:
            return settled
        fence = settled.record.fence  # type: ignore[union-attr]
        return await await_done(  # type: ignore[no-any-return]
            self._claimed, fence, caller, key, operation, args, handler, ctx, one_step
        )

    def _claimed(
        self,
        fence: int,
        caller: str,
        key: str,
        operation: str,
        args: Any,
        handler: Handler,
        ctx: context.Context | None,
        one_step: bool,
        done: Callable[[Outcome | None, BaseException | None], None],
    ) -> None:
        """Claim ``fence`` is held: run the handler and record its outcome, now when it
        returns at once."""
        rk = (caller, key)
        self._holders[rk] = fence
        if self._keeper is not False and self._keeper is not lowlevel.current_runtime():
            self._start_keeper()
        try:
            result = handler(Call(caller, key, operation, args, fence, ctx))
        except Exception as exc:
            self._handler_failed(exc, caller, key, fence, done)
            return
        self._handler_returned(result, caller, key, fence, one_step, done)

    def _handler_returned(
        self,
        result: Any,
        caller: str,
        key: str,
        fence: int,
        one_step: bool,
        done: Callable[[Outcome | None, BaseException | None], None],
    ) -> None:
        """The handler of claim ``fence`` returned ``result``: record it (an awaitable
        awaited first, in a goroutine), or fail the call as :meth:`_handler_failed`
        says when it cannot be recorded."""
        try:
            if hasattr(result, "__await__"):
                if one_step:
                    _refuse_awaitable(result)  # the same promise on every store
                go(deliver, self._awaited(result, caller, key, fence), done)
                return
            completion = self._completion(result)
        except Exception as exc:
            self._handler_failed(exc, caller, key, fence, done)
            return
        self._complete(caller, key, fence, completion, done)

    def _handler_failed(
        self,
        exc: Exception,
        caller: str,
        key: str,
        fence: int,
        done: Callable[[Outcome | None, BaseException | None], None],
    ) -> None:
        """The handler of claim ``fence`` raised ``exc`` (or its result cannot be
        recorded): record a final ApplicationError, or release the claim and hand the
        exception to ``done``."""
        failure = self._failure(exc)
        if not isinstance(failure, Completion):
            go(deliver, self._release_raising(failure, caller, key, fence), done)
            return
        self._complete(caller, key, fence, failure, done)

    def _completion(self, result: Any) -> Completion:
        """A handler's return value as the completion that records it (InvalidResult
        when it cannot be encoded within ``max_result_bytes``)."""
        max_bytes = self.max_result_bytes
        if isinstance(result, Effect):
            return new_completion(Completion, (True, None, result, self.ttl, max_bytes))
        payload = encode_result(result, max_bytes)
        return new_completion(Completion, (True, payload, None, self.ttl, max_bytes))

    async def _awaited(self, result: Awaitable[Any], caller: str, key: str, fence: int) -> Outcome:
        """A two-step handler's awaitable, awaited (in a goroutine), then recorded."""
        try:
            completion = self._completion(await result)
        except Exception as exc:
            failure = self._failure(exc)
            if not isinstance(failure, Completion):
                await self._release(caller, key, fence)
                raise failure  # noqa: B904 -- the handler's own exception, or what it made
            completion = failure
        return await await_done(self._complete, caller, key, fence, completion)  # type: ignore[no-any-return]

    def _failure(self, exc: Exception) -> Completion | Exception:
        """What the handler's ``exc`` makes of its call: the completion recording a final
        ApplicationError, or the exception to raise once the claim is released (a
        retryable error, any other exception, or InvalidResult for an error too big)."""
        if isinstance(exc, ApplicationError) and not exc.retryable:
            max_bytes = self.max_result_bytes
            try:
                payload = encode_error(exc, max_bytes)
            except InvalidResult as invalid:
                return invalid
            return Completion(False, payload, None, self.ttl, max_bytes)
        return exc

    def _complete(
        self,
        caller: str,
        key: str,
        fence: int,
        completion: Completion,
        done: Callable[[Outcome | None, BaseException | None], None],
    ) -> None:
        """Record the outcome of claim ``fence``, then report it to ``done``."""
        sync = self._sync_store
        if sync is not None:
            try:
                rec = sync.complete_sync(caller, key, fence, completion)
            except Exception as exc:
                self._completed(caller, key, fence, done, None, exc)
                return
            self._completed(caller, key, fence, done, rec, None)
            return
        store = self._callback_store
        assert store is not None
        store.complete_later(
            caller, key, fence, completion,
            functools.partial(self._completed, caller, key, fence, done),
        )  # fmt: skip

    def _completed(
        self,
        caller: str,
        key: str,
        fence: int,
        done: Callable[[Outcome | None, BaseException | None], None],
        rec: Record | None,
        error: BaseException | None,
    ) -> None:
        """The record of claim ``fence`` is over: the outcome to ``done``; a failure
        other than StaleClaim releases the claim first (in a goroutine)."""
        rk = (caller, key)
        if error is not None:
            if isinstance(error, StaleClaim) or not isinstance(error, Exception):
                self._finish(rk, fence)
                done(None, error)
            else:
                # The effect failed or could not be recorded, or the store failed:
                # nothing was recorded; free the key so a retry need not wait for the
                # lease.
                go(deliver, self._release_raising(error, caller, key, fence), done)
            return
        # _finish, inlined: this runs on every call.
        holders = self._holders
        if holders.get(rk) == fence:
            del holders[rk]
        if self._waiters:
            self._wake(rk)
        assert rec is not None and rec.payload is not None
        done(Outcome(rec.ok, rec.payload, False, fence), None)

    async def _release_raising(self, exc: Exception, caller: str, key: str, fence: int) -> Any:
        await self._release(caller, key, fence)
        raise exc

    def _one_step(
        self,
        caller: str,
        key: str,
        operation: str,
        args: Any,
        fp: bytes,
        handler: Handler,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
        done: Callable[[Outcome | None, BaseException | None], None],
    ) -> None:
        """The one mechanism of a one-step call on a OneStepStore (``run_later``;
        ``run(one_step=True)`` waits on it): the handler runs now, and the store's batch
        calls back."""
        store = self._one_step_store
        assert store is not None
        call = Call(caller, key, operation, args, 0, ctx)
        completion = self._one_step_completion(handler, call)
        store.claim_and_complete_later(
            caller, key, fp, self.lease, call, completion,
            functools.partial(
                self._one_step_done, done, caller, key, fp, call, completion, wait, timeout, ctx,
            ),
        )  # fmt: skip

    def _one_step_done(
        self,
        done: Callable[[Outcome | None, BaseException | None], None],
        caller: str,
        key: str,
        fp: bytes,
        call: Call,
        completion: Completion,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
        out: ClaimResult | Record | None,
        error: BaseException | None,
    ) -> None:
        """run_later's store callback: the outcome to ``done``, or a goroutine for the
        rest of the step when the key was busy."""
        if error is not None:
            done(None, error)
            return
        assert out is not None
        outcome = _one_step_outcome(out)
        if outcome is not None:
            done(outcome, None)
            return
        assert isinstance(out, ClaimResult)
        rest = self._one_step_rest(out, caller, key, fp, call, completion, wait, timeout, ctx)
        go(deliver, rest, done)

    def _one_step_completion(self, handler: Handler, call: Call) -> Completion:
        """Run a one-step handler (at once, in the caller) and make its completion."""
        max_bytes = self.max_result_bytes
        try:
            result = handler(call)
            if hasattr(result, "__await__"):
                _refuse_awaitable(result)  # never awaited, and never to be
            if isinstance(result, Effect):
                return new_completion(Completion, (True, None, result, self.ttl, max_bytes))
            payload = encode_result(result, max_bytes)
            return new_completion(Completion, (True, payload, None, self.ttl, max_bytes))
        except ApplicationError as err:
            if err.retryable:
                raise  # nothing was claimed: a retry runs the handler again
            return Completion(False, encode_error(err, max_bytes), None, self.ttl, max_bytes)

    async def _one_step_rest(
        self,
        out: ClaimResult,
        caller: str,
        key: str,
        fp: bytes,
        call: Call,
        completion: Completion,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
    ) -> Outcome:
        """A one-step call whose claim found the key busy (a two-step execution holds
        it) or live for another request: as run() does."""
        settled = await self._settle(out, caller, key, fp, wait, timeout, ctx)
        if type(settled) is Outcome:
            return settled
        # Claimed after the holder lapsed: complete this step's outcome under that claim.
        fence = settled.record.fence  # type: ignore[union-attr]
        call.fence = fence
        rk = (caller, key)
        self._holders[rk] = fence
        try:
            rec = await self._store.complete(caller, key, fence, completion)
        except StaleClaim:
            raise
        except Exception:
            await self._release(caller, key, fence)
            raise
        finally:
            self._finish(rk, fence)
        assert rec.payload is not None
        return Outcome(rec.ok, rec.payload, False, fence)

    def _start_keeper(self) -> None:
        rt = lowlevel.current_runtime()
        if self.lease == math.inf:
            self._keeper = False  # a claim that never lapses needs no renewal
            return
        self._keeper = rt
        go(self._keep_alive, rt)

    async def _keep_alive(self, rt: Any) -> None:
        """Renew this process's claims while their handlers run (see the module
        docstring): every ``lease / 4``, each claim held since the last tick, so a claim
        is renewed at most half a lease after it was taken, then every quarter lease.
        Fenced: a claim taken over is refused (StaleClaim) and not renewed again. Ends
        at the first tick that finds no claim held, or with its runtime."""
        seen: dict[tuple[str, str], int] = {}
        lost: set[tuple[tuple[str, str], int]] = set()
        holders = self._holders
        try:
            while True:
                await gosim.sleep(self.lease / 4)
                if not holders:
                    return
                due = [(rk, f) for rk, f in holders.items() if seen.get(rk) == f]
                seen = dict(holders)
                lost.intersection_update(seen.items())
                for rk, fence in due:
                    if holders.get(rk) != fence or (rk, fence) in lost:
                        continue  # finished while an earlier renewal ran, or lost
                    try:
                        await self._store.renew(rk[0], rk[1], fence, self.lease)
                    except StaleClaim:
                        lost.add((rk, fence))  # its completion will say so
                    except StoreError:
                        pass  # down for now: the next tick tries again
                    except NotImplementedError:
                        self._keeper = False  # never again: leases bound handlers
                        return
        finally:
            if self._keeper is rt:
                self._keeper = None

    def _finish(self, rk: tuple[str, str], fence: int) -> None:
        """The execution of claim ``fence`` is over: wake this process's waiters."""
        if self._holders.get(rk) == fence:
            del self._holders[rk]
        if self._waiters:
            self._wake(rk)

    def _wake(self, rk: tuple[str, str]) -> None:
        ch = self._waiters.pop(rk, None)
        if ch is not None:
            ch.close()

    async def _release(self, caller: str, key: str, fence: int) -> None:
        try:
            await self._store.release(caller, key, fence)
        except StoreError:
            pass  # the store is down: the claim lapses with its lease instead
        finally:
            self._finish((caller, key), fence)

    async def _settle(
        self,
        res: ClaimResult,
        caller: str,
        key: str,
        fp: bytes,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
    ) -> Outcome | ClaimResult:
        """Turn a claim that did not succeed into an outcome, an error, or (after waiting
        for a holder that released or lapsed) a successful claim."""
        rk = (caller, key)
        start = deadline = math.inf
        interval = POLL_MIN
        done = ctx.done() if ctx is not None else None
        while True:
            kind = res.kind
            if kind is _CLAIMED:
                return res
            if kind is _REPLAY:
                rec = res.record
                assert rec.payload is not None
                return Outcome(rec.ok, rec.payload, True, rec.fence)
            if kind is _MISMATCH:
                raise KeyReused(caller, key)
            # BUSY: another execution holds the key.
            if not wait:
                raise InProgress(caller, key)
            now = gosim.now()
            if start == math.inf:
                start = now
                deadline = now + timeout if timeout is not None else math.inf
            if ctx is not None and (err := ctx.err()) is not None:
                raise err
            if now >= deadline:
                raise InProgress(caller, key, waited=now - start)
            ch = self._waiters.get(rk)
            if ch is None:
                # Registered now: claim again before sleeping, in case the holder
                # finished before the channel existed (it would not have closed it).
                self._waiters[rk] = Chan()
                res = await self._store.claim(caller, key, fp, self.lease)
                continue
            if rk in self._holders:
                # The holder runs here: it closes ``ch`` when done. If it overruns its
                # lease, claim again as the lease lapses (and take the key over).
                sleep = max(0.0, res.record.expires_at - self._store.now()) + POLL_MIN
            else:
                # The holder is another process: poll, backing off.
                sleep = interval
                interval = min(interval * 2, POLL_MAX)
            timer = gosim.Timer(max(0.0, min(sleep, deadline - now)))
            try:
                await select(recv(ch), recv(timer.c), recv(done))
            finally:
                timer.stop()
            res = await self._store.claim(caller, key, fp, self.lease)


def _py_continuation(
    idem: Idempotency,
    caller: str,
    key: str,
    operation: str,
    args: Any,
    fp: bytes,
    handler: Handler,
    wait: bool,
    timeout: float | None,
    ctx: context.Context | None,
    one_step: bool,
    done: Callable[[Outcome | None, BaseException | None], None],
) -> Callable[[ClaimResult | None, BaseException | None], None]:
    """A two-step call's continuation, called with its claim's answer (``claim_later``'s
    callback, or called with ``claim_sync``'s): :meth:`Idempotency._on_claim` for this
    call, and from there the handler, the record (:meth:`Idempotency._complete`) and
    ``done``.

    The reference of its C twin, ``_speedups.TwoStepCall``: one object that is called
    with the claim's answer and then (as ``complete_later``'s callback, or by itself
    after ``complete_sync``) with the record's, and runs the common case between them
    (claimed; a handler returning a plain value at once; the record written) without a
    Python frame, handing every other case to these methods."""
    return functools.partial(
        idem._on_claim, caller, key, operation, args, fp, handler, wait, timeout, ctx,
        one_step, done,
    )  # fmt: skip


def _py_run_later(
    idem: Idempotency,
    done: Callable[[Outcome | None, BaseException | None], None],
    caller: str,
    key: str,
    request: tuple[str, Any],
    handler: Handler,
    timeout: float | None,
    one_step: bool,
) -> None:
    """:meth:`Idempotency.run_later` with positional arguments (``wait`` and ``ctx``
    their defaults): how the RPC server starts a keyed call. The reference of the C twin
    ``_speedups.run_later``, which takes the common case (a plain key and caller, a
    request that is a pair, ``one_step`` a bool, a store that takes the call without a
    goroutine) through ``_checked`` and on to ``_one_step`` or ``_two_step``'s steps
    without their frames, and hands every other here."""
    idem.run_later(
        done, caller=caller, key=key, request=request, handler=handler, timeout=timeout,
        one_step=one_step,
    )  # fmt: skip


_continuation: Callable[..., Callable[[ClaimResult | None, BaseException | None], None]]
_continuation = _py_continuation
run_later: Callable[..., None] = _py_run_later
if _speedups is not None and _speedups.configure_two_step(
    call=Call,
    outcome=Outcome,
    completion=Completion,
    pack=_outcome_packb,
    not_decoded=_NOT_DECODED,
    current_runtime=lowlevel.current_runtime,
    run_later=_py_run_later,
    max_key_length=MAX_KEY_LENGTH,
):
    _continuation = _speedups.TwoStepCall
    run_later = _speedups.run_later
