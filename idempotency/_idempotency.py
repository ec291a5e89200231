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
so a holder killed mid-call leaves no claim to wait out: the store's batch calls back
once the commit returned, and the call is over.

The two steps have one mechanism too, on every store: a :class:`KeyedCall`, one object
per call whose methods are the protocol's steps, which the store answers with its bound
methods. On a ``SynchronousStore`` (memory) the claim, a handler that returns at once
and the record run in the caller's frame; on a ``CallbackStore`` (the batched stores)
the handler runs in the claim's callback and the call finishes in the record's, so it
waits on no goroutine. Only what must wait gets one: a busy key, a handler's awaitable, a
release. A store with only the ``Store`` contract's coroutines (an application's own)
has each step awaited in a goroutine of its own (``_AwaitedSteps``), so the protocol is
written once. A KeyedCall is a :class:`gosim.lowlevel.Waiter` settled with its
outcome: ``run`` waits on it; ``run_later`` begins it with ``done`` as its callback and
returns; the RPC server's call (``rpc._dispatch.RPCCall``) is a subclass settled with
its reply's bytes instead, which the server waits on.

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

import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, Self, TypeAlias

import gosim
from gosim import Chan, context, go, lowlevel, recv, select
from gosim.lowlevel import Waiter

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
from ._waiter import _COMMIT_WAIT
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
        # whose handler returns at once waits on no goroutine. A store with only the
        # contract's coroutines gets them awaited in goroutines: one protocol for all.
        self._callback_store: CallbackStore | _AwaitedSteps | None = None
        if isinstance(store, CallbackStore):
            self._callback_store = store
        elif self._sync_store is None:
            self._callback_store = _AwaitedSteps(store)
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
        call = _KeyedCall(
            self, caller, key, request, handler,
            wait=self.wait if wait is None else wait, timeout=timeout, ctx=ctx,
            one_step=one_step,
        )  # fmt: skip
        call.begin()
        return await call.wait(_COMMIT_WAIT)  # type: ignore[no-any-return]

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
        call = _KeyedCall(
            self, caller, key, request, handler,
            wait=self.wait if wait is None else wait, timeout=timeout, ctx=ctx,
            one_step=one_step,
        )  # fmt: skip
        call.on_settle(_hand_outcome, done)
        call.begin()

    def _completion(self, result: Any) -> Completion:
        """A handler's return value as the completion that records it (InvalidResult
        when it cannot be encoded within ``max_result_bytes``)."""
        max_bytes = self.max_result_bytes
        if isinstance(result, Effect):
            return new_completion(Completion, (True, None, result, self.ttl, max_bytes))
        payload = encode_result(result, max_bytes)
        return new_completion(Completion, (True, payload, None, self.ttl, max_bytes))

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


class KeyedCall(Waiter):
    """One keyed call on its way, from the checked request to its outcome: the
    request, the claim it holds, and the call's end, which settles it (a KeyedCall is
    the :class:`gosim.lowlevel.Waiter` its caller waits on). The protocol's steps are
    its methods, each called when the step before it is over, by the caller or by a
    store's batch:

    - two steps (:meth:`start`): claim the key; the claim's answer comes to
      :meth:`on_claim`; claimed, :meth:`claimed` runs the handler, whose value goes
      to :meth:`handler_returned` (an exception to :meth:`handler_failed`);
      :meth:`record` writes the outcome, whose answer comes to :meth:`on_record`,
      which finishes the call with the :class:`Outcome`;
    - one step (:meth:`start_one_step`, on a OneStepStore when promised): the handler
      runs first, the store claims, applies and records in one transaction, and its
      answer comes to :meth:`on_one_step`.

    :meth:`begin` takes the one the call was made for. Stores answer with the object's
    bound methods. Only what must wait gets a goroutine, which runs the rest of the call
    from there: a busy key (:meth:`settle_then_run`, :meth:`settle_then_record`), a
    handler's awaitable (:meth:`awaited`), a release before an error
    (:meth:`release_then_fail`).

    Made with :meth:`Idempotency.run`'s arguments, positionally up to ``handler``; the
    constructor checks them as ``run`` does (InvalidKey, InvalidRequest), so a call
    that exists is one that may start. The call has two ends: :meth:`invoke` runs the
    handler, and :meth:`finish` is every way out, called exactly once (unless a step
    raised to the caller of :meth:`begin`, a SynchronousStore's failed claim, which
    then owns the error); it settles the call with the outcome or fails it with the
    error. A subclass that runs its handler or answers its caller another way (the RPC
    server's call, whose end is its reply's bytes) overrides those two and nothing else;
    its own slots are set by whoever makes it, before :meth:`begin`.

    The class is its own reference. Where the C accelerator is built, ``_KeyedCall``
    below is its twin, a subclass made by ``_speedups.twin_of`` whose C methods take
    the two-step common case -- claimed, a handler that returns a plain value at once,
    the record written -- without a Python frame, and call this class's method for
    every other case, on the same object.
    """

    __slots__ = (
        "args", "caller", "completion", "ctx", "fence", "fp", "given", "handler", "idem",
        "key", "one_step", "operation", "timeout", "wait_busy",
    )  # fmt: skip

    # A Waiter's constructor takes at most its ``data``: it is given none of this
    # class's arguments.
    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        return Waiter.__new__(cls)

    def __init__(
        self,
        idem: Idempotency,
        caller: str,
        key: str,
        request: tuple[str, Any],
        handler: Handler | None,
        *,
        wait: bool,
        timeout: float | None,
        ctx: context.Context | None,
        one_step: bool,
    ) -> None:
        super().__init__()
        self.caller, self.key, self.operation, self.args, self.fp = _checked(
            caller, key, request, idem.max_args_bytes
        )
        self.idem = idem
        self.handler = handler
        self.wait_busy = wait  # a busy key is waited for (else InProgress)
        self.timeout = timeout
        self.ctx = ctx
        self.one_step = one_step
        self.fence = 0  # the claim's fencing token, once claimed
        self.given: Call | None = None  # one step: the Call the handler was given
        self.completion: Completion | None = None  # one step: what the handler built

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.operation} caller={self.caller!r} key={self.key!r}>"

    def begin(self) -> None:
        """Start the call: in one step on a store that can take it when it was
        promised (``one_step``), else in two."""
        if self.one_step and self.idem._one_step_store is not None:
            self.start_one_step()
        else:
            self.start()

    # The two ends.

    def invoke(self, call: Call) -> Any:
        """Run the handler with ``call``; what it returns (or raises)."""
        assert self.handler is not None
        return self.handler(call)

    def finish(self, outcome: Outcome | None, error: BaseException | None) -> None:
        """The call is over, with ``outcome`` or ``error``: settle it with that."""
        if error is None:
            self.settle(outcome)
        else:
            self.fail(error)

    # Two steps.

    def start(self) -> None:
        """Claim the key: on a SynchronousStore now (a failed claim raises to the
        caller), else the store's batch answers :meth:`on_claim`."""
        idem = self.idem
        sync = idem._sync_store
        if sync is not None:
            self.on_claim(sync.claim_sync(self.caller, self.key, self.fp, idem.lease), None)
            return
        store = idem._callback_store
        assert store is not None
        store.claim_later(self.caller, self.key, self.fp, idem.lease, self.on_claim)

    def on_claim(self, res: ClaimResult | None, error: BaseException | None) -> None:
        """The claim's answer: run the call on, or report."""
        if error is not None:
            self.finish(None, error)
            return
        assert res is not None
        kind = res.kind
        if kind is _CLAIMED:
            self.claimed(res.record.fence)
        elif kind is _REPLAY:
            rec = res.record
            assert rec.payload is not None
            self.finish(Outcome(rec.ok, rec.payload, True, rec.fence), None)
        else:
            go(self.settle_then_run, res)

    async def settle_then_run(self, res: ClaimResult) -> None:
        """The key was busy or live for another request (in a goroutine): settle it,
        waiting; then, claimed, the rest of the call."""
        try:
            settled = await self.idem._settle(
                res, self.caller, self.key, self.fp, self.wait_busy, self.timeout, self.ctx
            )
        except Exception as exc:
            self.finish(None, exc)
            return
        if type(settled) is Outcome:
            self.finish(settled, None)
            return
        self.claimed(settled.record.fence)  # type: ignore[union-attr]

    def claimed(self, fence: int) -> None:
        """Claim ``fence`` is held: keep it alive, run the handler, and record its
        outcome (now, when the handler returns at once)."""
        self.fence = fence
        idem = self.idem
        idem._holders[(self.caller, self.key)] = fence
        if idem._keeper is not False and idem._keeper is not lowlevel.current_runtime():
            idem._start_keeper()
        try:
            result = self.invoke(
                Call(self.caller, self.key, self.operation, self.args, fence, self.ctx)
            )
        except Exception as exc:
            self.handler_failed(exc)
            return
        self.handler_returned(result)

    def handler_returned(self, result: Any) -> None:
        """The handler returned ``result``: record it (an awaitable awaited first, in a
        goroutine), or fail the call as :meth:`handler_failed` says when it cannot be
        recorded."""
        try:
            if hasattr(result, "__await__"):
                if self.one_step:
                    _refuse_awaitable(result)  # the same promise on every store
                go(self.awaited, result)
                return
            completion = self.idem._completion(result)
        except Exception as exc:
            self.handler_failed(exc)
            return
        self.record(completion)

    def handler_failed(self, exc: Exception) -> None:
        """The handler raised ``exc`` (or its result cannot be recorded): record a final
        ApplicationError, or release the claim and finish the call with the exception."""
        failure = self.idem._failure(exc)
        if not isinstance(failure, Completion):
            go(self.release_then_fail, failure)
            return
        self.record(failure)

    async def awaited(self, result: Awaitable[Any]) -> None:
        """The handler's awaitable, awaited (in a goroutine), then recorded."""
        idem = self.idem
        try:
            completion = idem._completion(await result)
        except Exception as exc:
            failure = idem._failure(exc)
            if not isinstance(failure, Completion):
                await self.release_then_fail(failure)
                return
            completion = failure
        self.record(completion)

    def record(self, completion: Completion) -> None:
        """Record the outcome: on a SynchronousStore now, else the store's batch
        answers :meth:`on_record`."""
        idem = self.idem
        sync = idem._sync_store
        if sync is not None:
            try:
                rec = sync.complete_sync(self.caller, self.key, self.fence, completion)
            except Exception as exc:
                self.on_record(None, exc)
                return
            self.on_record(rec, None)
            return
        store = idem._callback_store
        assert store is not None
        store.complete_later(self.caller, self.key, self.fence, completion, self.on_record)

    def on_record(self, rec: Record | None, error: BaseException | None) -> None:
        """The record's answer: the outcome to ``done``. A failure other than
        StaleClaim releases the claim first (in a goroutine): nothing was recorded, and
        a retry need not wait for the lease."""
        idem = self.idem
        if error is not None and isinstance(error, Exception) and not isinstance(error, StaleClaim):
            go(self.release_then_fail, error)
            return
        idem._finish((self.caller, self.key), self.fence)
        if error is not None:
            self.finish(None, error)
            return
        assert rec is not None and rec.payload is not None
        self.finish(Outcome(rec.ok, rec.payload, False, self.fence), None)

    async def release_then_fail(self, exc: Exception) -> None:
        """Release the claim (waiting), then finish the call with ``exc`` (or with
        what the release raised)."""
        try:
            await self.idem._release(self.caller, self.key, self.fence)
        except Exception as release_error:
            self.finish(None, release_error)
            return
        self.finish(None, exc)

    # One step.

    def start_one_step(self) -> None:
        """Run the handler now (what it raises, this raises: nothing was claimed) and
        hand its completion to the store, whose batch answers :meth:`on_one_step`."""
        idem = self.idem
        store = idem._one_step_store
        assert store is not None
        given = self.given = Call(self.caller, self.key, self.operation, self.args, 0, self.ctx)
        completion = self.completion = self.built(given)
        store.claim_and_complete_later(
            self.caller, self.key, self.fp, idem.lease, given, completion, self.on_one_step
        )

    def built(self, given: Call) -> Completion:
        """Run a one-step handler (at once) and make its completion."""
        idem = self.idem
        max_bytes = idem.max_result_bytes
        try:
            result = self.invoke(given)
            if hasattr(result, "__await__"):
                _refuse_awaitable(result)  # never awaited, and never to be
            return idem._completion(result)
        except ApplicationError as err:
            if err.retryable:
                raise  # nothing was claimed: a retry runs the handler again
            return Completion(False, encode_error(err, max_bytes), None, idem.ttl, max_bytes)

    def on_one_step(self, out: ClaimResult | Record | None, error: BaseException | None) -> None:
        """The store's answer: the call finished with the outcome, or a goroutine for the rest of
        the call when the key was busy or live for another request."""
        if error is not None:
            self.finish(None, error)
            return
        assert out is not None
        outcome = _one_step_outcome(out)
        if outcome is not None:
            self.finish(outcome, None)
            return
        assert isinstance(out, ClaimResult)
        go(deliver, self.settle_then_record(out), self.finish)

    async def settle_then_record(self, out: ClaimResult) -> Outcome:
        """Settle a busy key as :meth:`settle_then_run` does (in a goroutine, whose
        ``deliver`` finishes the call with what this returns or raises); claimed after
        the holder lapsed, record this call's completion under that claim."""
        idem = self.idem
        caller, key = self.caller, self.key
        settled = await idem._settle(
            out, caller, key, self.fp, self.wait_busy, self.timeout, self.ctx
        )
        if type(settled) is Outcome:
            return settled
        fence = self.fence = settled.record.fence  # type: ignore[union-attr]
        assert self.given is not None and self.completion is not None
        self.given.fence = fence
        rk = (caller, key)
        idem._holders[rk] = fence
        try:
            rec = await idem._store.complete(caller, key, fence, self.completion)
        except StaleClaim:
            raise
        except Exception:
            await idem._release(caller, key, fence)
            raise
        finally:
            idem._finish(rk, fence)
        assert rec.payload is not None
        return Outcome(rec.ok, rec.payload, False, fence)


class _AwaitedSteps:
    """``claim_later`` and ``complete_later`` over a store with only the
    :class:`~idempotency.stores.Store` contract's coroutines (an application's own):
    each step awaited in a goroutine of its own, so :class:`KeyedCall` is the one
    protocol on every store."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    def claim_later(
        self,
        caller: str,
        key: str,
        fingerprint: bytes,
        lease: float,
        done: Callable[[ClaimResult | None, BaseException | None], None],
    ) -> None:
        go(deliver, self._store.claim(caller, key, fingerprint, lease), done)

    def complete_later(
        self,
        caller: str,
        key: str,
        fence: int,
        completion: Completion,
        done: Callable[[Record | None, BaseException | None], None],
    ) -> None:
        go(deliver, self._store.complete(caller, key, fence, completion), done)


def _hand_outcome(
    done: Callable[[Outcome | None, BaseException | None], None], call: Waiter
) -> None:
    """:meth:`Idempotency.run_later`'s consumer of a settled call: ``done(outcome, error)``."""
    try:
        outcome = call.result()
    except BaseException as exc:  # the call's error, as finish was given it
        done(None, exc)
        return
    done(outcome, None)


# The one place that chooses C or Python for a keyed call: the C twin (a subclass with
# the common case's methods in C) when it is built and accepts this module's classes.
_KeyedCall: type[KeyedCall] = KeyedCall
if _speedups is not None:
    _KeyedCall = (
        _speedups.configure_two_step(
            call=Call,
            outcome=Outcome,
            completion=Completion,
            keyed_call=KeyedCall,
            pack=_outcome_packb,
            not_decoded=_NOT_DECODED,
            current_runtime=lowlevel.current_runtime,
            max_key_length=MAX_KEY_LENGTH,
        )
        or KeyedCall
    )
