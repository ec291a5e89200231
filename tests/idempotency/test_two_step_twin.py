"""The C twin of a keyed call (``_idempotency._KeyedCall``, a subclass of
``_idempotency.KeyedCall`` with its two-step common case in C) against the class itself.

A scripted store answers the claim and the record as hypothesis draws them (a
CallbackStore now, in the caller's frame, or later, from a goroutine; or a
SynchronousStore); the handler returns or raises what is drawn. The same script runs
through each continuation on a seeded runtime, and everything observable must be the
same: what the store was asked (the completion's every field), what the handler was
given, how the call ended (the outcome's every slot, or the error) or what it raised,
the claims still held, and the store's releases.

The making and the start of a call (its constructor's checks, ``begin``) are compared
the same way over keys, callers and requests good and bad, on every kind of store, with
busy keys waited for or not.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gosim
from idempotency import ApplicationError, Idempotency, StaleClaim, StoreUnavailable, _idempotency
from idempotency._accel import speedups
from idempotency._keys import fingerprint
from idempotency._record import COMPLETED, IN_PROGRESS, ClaimKind, ClaimResult, Record
from idempotency.stores import (
    CallbackStore,
    Completion,
    Effect,
    MemoryStore,
    SQLiteStore,
    Store,
    StoreStatistics,
    SynchronousStore,
)

from ._leaks import leaks

pytestmark = pytest.mark.skipif(
    speedups is None, reason="idempotency._speedups not in use (not built, or GOSIM_PURE_PYTHON=1)"
)

FP = b"\x07" * 32
# A SQLiteStore on a virtual clock needs a clock that follows the runtime's.
_FOLLOWS = lambda: 1_700_000_000.0 + gosim.now()  # noqa: E731
OTHER_FP = b"\x08" * 32


class Script(Store):
    """Answers as its script says, and writes down everything it is asked."""

    def __init__(self, claim: str, complete: str, now: bool) -> None:
        self.claim_answer = claim
        self.complete_answer = complete
        self.answer_now = now
        self.log: list[Any] = []

    def _answer(self, done: Any, result: Any, error: BaseException | None) -> None:
        if self.answer_now:
            done(result, error)
            return

        async def later() -> None:
            await gosim.gosched()
            done(result, error)

        gosim.go(later)

    def _claim_answer(
        self, caller: str, key: str, fingerprint: bytes, lease: float
    ) -> tuple[ClaimResult | None, BaseException | None]:
        self.log.append(("claim", caller, key, fingerprint, lease))
        how = self.claim_answer
        if how == "error":
            return None, StoreUnavailable("the store is down")
        if how == "claimed":
            rec = Record(IN_PROGRESS, fingerprint, 41, 1e9, None, None)
            res = ClaimResult(ClaimKind.CLAIMED, rec)
        elif how == "replay":
            rec = Record(COMPLETED, fingerprint, 40, 1e9, True, b"\xa3old")
            res = ClaimResult(ClaimKind.REPLAY, rec)
        elif how == "busy":
            rec = Record(IN_PROGRESS, fingerprint, 39, 1e9, None, None)
            res = ClaimResult(ClaimKind.BUSY, rec)
        else:
            rec = Record(COMPLETED, OTHER_FP, 38, 1e9, True, b"\xa3old")
            res = ClaimResult(ClaimKind.MISMATCH, rec)
        return res, None

    def _complete_answer(
        self, caller: str, key: str, fence: int, completion: Completion
    ) -> tuple[Record | None, BaseException | None]:
        fields = tuple((type(x).__name__, x) for x in completion)
        self.log.append(("complete", caller, key, fence, type(completion).__name__, fields))
        how = self.complete_answer
        if how == "stale":
            return None, StaleClaim(caller, key, fence, "taken over")
        if how == "down":
            return None, StoreUnavailable("the store went down")
        # An effect's result stands in for what the effect would have returned.
        payload = b"\xa6effect" if completion.payload is None else completion.payload
        return Record(COMPLETED, FP, fence, 1e9, completion.ok, payload), None

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        raise AssertionError("a two-step call on a CallbackStore claims through claim_later")

    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        raise AssertionError("a two-step call on a CallbackStore records through complete_later")

    async def release(self, caller: str, key: str, fence: int) -> bool:
        self.log.append(("release", caller, key, fence))
        return True

    async def get(self, caller: str, key: str) -> Record | None:
        return None

    async def sweep(self) -> int:
        return 0

    def now(self) -> float:
        return 0.0

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(0, 0, 0)


class ScriptedStore(Script, CallbackStore):
    """The script on a store whose operations call back (the batched stores' kind): now,
    in the caller's frame, or later, from a goroutine."""

    def claim_later(
        self, caller: str, key: str, fingerprint: bytes, lease: float, done: Any
    ) -> None:
        self._answer(done, *self._claim_answer(caller, key, fingerprint, lease))

    def complete_later(
        self, caller: str, key: str, fence: int, completion: Completion, done: Any
    ) -> None:
        self._answer(done, *self._complete_answer(caller, key, fence, completion))


class ScriptedSyncStore(Script, SynchronousStore):
    """The same script on a store whose operations answer at once (MemoryStore's kind):
    its answers are returned or raised."""

    def claim_sync(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        res, error = self._claim_answer(caller, key, fingerprint, lease)
        if error is not None:
            raise error
        assert res is not None
        return res

    def complete_sync(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        rec, error = self._complete_answer(caller, key, fence, completion)
        if error is not None:
            raise error
        assert rec is not None
        return rec


class OddValue(list[Any]):
    """Encodable, but not of an exact plain type: the reference records it."""


class ListEffect(list[Any], Effect):
    """An effect msgpack would encode as a list: recorded as an effect, not a value."""


LIST_EFFECT = ListEffect([1, 2])


async def _coroutine_value() -> Any:
    return [1, "awaited"]


def _returns(kind: str) -> Any:
    """What the handler does, by name."""
    if kind == "app-error":
        raise ApplicationError(7, "refused", {"why": "drawn"})
    if kind == "retryable-error":
        raise ApplicationError(8, "later", None, retryable=True)
    if kind == "value-error":
        raise ValueError("the handler failed")
    if kind == "too-big":
        return "x" * 300
    if kind == "at-limit":  # 2 bytes of header: exactly max_result_bytes
        return "x" * 198
    if kind == "over-limit":
        return "x" * 199
    if kind == "unencodable":
        return [1, object()]
    if kind == "odd":
        return OddValue([1, 2])
    if kind == "awaitable":
        return _coroutine_value()
    if kind == "effect":
        return LIST_EFFECT
    return {
        "none": None,
        "int": 12,
        "bool": True,
        "float": 1.5,
        "str": "hello",
        "bytes": b"\x00\x01",
        "list": [1, "a", [2]],
        "tuple": (1, 2),
        "dict": {"a": 1},
    }[kind]


HANDLER_KINDS = [
    "none", "int", "bool", "float", "str", "bytes", "list", "tuple", "dict", "too-big",
    "at-limit", "over-limit", "unencodable", "odd", "awaitable", "app-error",
    "retryable-error", "value-error", "effect",
]  # fmt: skip


def _ended(call: Any) -> Any:
    """How a settled call ended: its outcome, or its error."""
    try:
        return _describe(call.result(), None)
    except Exception as exc:
        return _describe(None, exc)


def _describe(outcome: Any, error: BaseException | None) -> Any:
    if error is not None:
        return ("error", type(error).__name__, str(error))
    slots = {name: getattr(outcome, name) for name in type(outcome).__slots__}
    slots["_value"] = slots["_value"] is _idempotency._NOT_DECODED
    return ("outcome", type(outcome).__name__, sorted(slots.items()))


def run_script(
    keyed_call: Any,
    claim: str,
    complete: str,
    now: bool,
    handler_kind: str,
    one_step: bool,
    sync: bool = False,
) -> Any:
    """Everything observable of one two-step call made by ``keyed_call`` (the class) and
    started (``sync``: on a SynchronousStore, where ``now`` means nothing)."""
    store = (ScriptedSyncStore if sync else ScriptedStore)(claim, complete, now)
    idem = Idempotency(store, max_result_bytes=200, wait=False)
    idem._keeper = False  # the scripted store cannot renew: no keep-alive goroutine
    seen: list[Any] = []
    results: list[Any] = []

    def handler(call: Any) -> Any:
        seen.append((type(call).__name__, [(n, getattr(call, n)) for n in type(call).__slots__]))
        return _returns(handler_kind)

    async def main() -> None:
        try:
            call = keyed_call(
                idem, "caller", "key", ("op", [1, 2]), handler,
                wait=False, timeout=None, ctx=None, one_step=one_step,
            )  # fmt: skip
            call.on_settle(lambda _, call: results.append(_ended(call)))
            call.start()
        except Exception as exc:  # a SynchronousStore's failed claim: the caller's
            results.append(("raised", type(exc).__name__, str(exc)))
        for _ in range(20):
            await gosim.gosched()

    gosim.run(main, procs=1, seed=3)
    return store.log, seen, results, sorted(idem._holders.items())


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["claimed", "claimed", "claimed", "replay", "busy", "mismatch", "error"]),
    st.sampled_from(["record", "record", "stale", "down"]),
    st.booleans(),
    st.sampled_from(HANDLER_KINDS),
    st.booleans(),
    st.booleans(),
)
@example("claimed", "record", False, "list", False, False)
@example("claimed", "record", True, "too-big", False, False)
@example("claimed", "stale", False, "int", False, False)
@example("claimed", "record", False, "awaitable", True, False)
@example("claimed", "down", True, "app-error", False, False)
@example("claimed", "record", True, "value-error", False, False)
@example("claimed", "record", False, "effect", False, False)
@example("claimed", "record", False, "list", False, True)
@example("claimed", "down", False, "int", False, True)
@example("claimed", "record", False, "value-error", False, True)
def test_the_twin_continuation_does_what_the_reference_does(
    claim: str, complete: str, now: bool, handler_kind: str, one_step: bool, sync: bool
) -> None:
    script = (claim, complete, now, handler_kind, one_step, sync)
    fast = run_script(_idempotency._KeyedCall, *script)
    ref = run_script(_idempotency.KeyedCall, *script)
    assert fast == ref
    assert len(fast[2]) == 1, "the call ended once, or it raised"


def test_the_twin_is_in_place_and_is_a_keyed_call() -> None:
    twin = _idempotency._KeyedCall
    assert twin is not _idempotency.KeyedCall
    assert twin.__bases__ == (_idempotency.KeyedCall,)
    assert type(twin.__dict__["on_claim"]).__name__ == "method_descriptor"  # C, not Python


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, 2), {}),
        ((1,) * 5, {"wait": 1, "timeout": 2, "ctx": 3}),
        ((1,) * 5, {"wait": 1, "timeout": 2, "ctx": 3, "one_steps": 4}),
        ((1,) * 12, {}),
    ],
)
def test_the_twin_refuses_bad_arguments_as_the_reference(args: Any, kwargs: Any) -> None:
    """A constructor call of the wrong shape: the reference's own TypeError."""
    errors = []
    for cls in (_idempotency._KeyedCall, _idempotency.KeyedCall):
        with pytest.raises(TypeError) as info:
            cls(*args, **kwargs)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_the_twin_steps_refuse_a_wrong_count_of_arguments() -> None:
    call = _idempotency._KeyedCall(
        Idempotency(MemoryStore()), "c", "k", ("op", []), lambda call: 1,
        wait=False, timeout=None, ctx=None, one_step=False,
    )  # fmt: skip
    for name in ("on_claim", "on_record", "finish"):
        with pytest.raises(TypeError, match=f"{name} takes 2 positional arguments"):
            getattr(call, name)(None)


def test_the_twin_continuation_leaks_nothing() -> None:
    """Its fast path and each hand-over, many times: nothing is left live and no
    reference count creeps."""
    kinds = [("record", "list"), ("record", "value-error"), ("stale", "int"),
             ("record", "too-big"), ("record", "app-error"), ("down", "int")]  # fmt: skip

    def work(n: int) -> None:
        for i in range(n):
            complete, handler_kind = kinds[i % len(kinds)]
            sync = i % 2 == 1
            run_script(
                _idempotency._KeyedCall, "claimed", complete, True, handler_kind, False, sync
            )

    moved, live = leaks(work, FP, warm=50, runs=300)
    assert moved == [0]
    assert live < 256 * 1024, f"{live} bytes still live after the calls"


# The making and start of a call: the twin against the class.


class KeySubclass(str):
    pass


KEYS = ["key", " ", "~", "k" * 255, "k" * 256, "", "kéy", "k\x00", "k\x1f", "k\x7f", "k\n"]
KEYS += [KeySubclass("key"), 5]
CALLERS = ["caller", "cällér", "c\t", KeySubclass("caller"), None, "c" * 256]
REQUESTS = [
    ("op", [1, 2]),
    ("op", (1, "a", [2.5])),
    ["op", [1, 2]],
    ("op", [1, 2], 3),
    ("op", ["x" * 300]),  # past max_args_bytes
    ("op", [object()]),  # not encodable
    (5, [1]),
    ("op", {"a": 1}),
]


class AwaitingClaim:
    """The awaiting claim the scripted stores refuse, answered by the script: a wait
    for a busy key claims again with it (and a store of neither kind, every call)."""

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> Any:
        res, error = self._claim_answer(caller, key, fingerprint, lease)  # type: ignore[attr-defined]
        if error is not None:
            raise error
        return res


class CallbackStart(AwaitingClaim, ScriptedStore):
    pass


class SyncStart(AwaitingClaim, ScriptedSyncStore):
    pass


class NeitherStart(AwaitingClaim, Script):
    pass


def run_start(
    keyed_call: Any,
    store_kind: str,
    caller: Any,
    key: Any,
    request: Any,
    one_step: bool,
    timeout: float | None,
    claim: str = "claimed",
    wait: bool = False,
    handler_kind: str = "list",
) -> Any:
    """Everything observable of one call made by ``keyed_call`` (the class) and begun
    (the types of what the store was given included), in virtual time: a wait for a
    busy key ends at its timeout, or is still waiting at the end."""
    store: Store
    files = tempfile.TemporaryDirectory()
    if store_kind in ("memory", "sqlite"):
        # SQLiteStore is a OneStepStore (one_step=True takes one step), MemoryStore not.
        store = (
            MemoryStore()
            if store_kind == "memory"
            else SQLiteStore(f"{files.name}/r.db", clock=_FOLLOWS)
        )
        if claim == "busy":  # held by another execution of the same request

            async def hold() -> None:
                fp = fingerprint(request[0], request[1], 200)
                await store.claim(caller, key, fp, 60.0)

            try:
                gosim.run(hold, procs=1, seed=3, virtual_time=True)
            except Exception:
                pass  # a request or key the store refuses: nothing held
    elif store_kind == "sync":
        store = SyncStart(claim, "record", True)
    elif store_kind == "neither":
        store = NeitherStart(claim, "record", True)
    else:
        store = CallbackStart(claim, "record", store_kind == "now")
    idem = Idempotency(store, max_args_bytes=200, wait=wait)
    idem._keeper = False
    seen: list[Any] = []
    results: list[Any] = []

    def handler(call: Any) -> Any:
        seen.append([(n, getattr(call, n)) for n in type(call).__slots__])
        return _returns(handler_kind)

    async def main() -> None:
        try:
            # Idempotency.run_later, with the class given
            call = keyed_call(
                idem, caller, key, request, handler,
                wait=wait, timeout=timeout, ctx=None, one_step=one_step,
            )  # fmt: skip
            call.on_settle(lambda _, call: results.append(_ended(call)))
            call.begin()
        except Exception as exc:
            results.append(("raised", type(exc).__name__, str(exc)))
        for _ in range(20):
            await gosim.gosched()
        await gosim.sleep(10)

    gosim.run(main, procs=1, seed=3, virtual_time=True)
    log = [tuple((type(x).__name__, x) for x in entry) for entry in getattr(store, "log", [])]
    if isinstance(store, (MemoryStore, SQLiteStore)):  # asked: one step, or two
        log = [store.statistics()]
        store.close()
    files.cleanup()
    return log, seen, results, sorted(idem._holders.items())


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["now", "later", "sync", "neither", "memory", "sqlite"]),
    st.sampled_from(CALLERS),
    st.sampled_from(KEYS),
    st.sampled_from(REQUESTS),
    st.sampled_from([False, False, True]),
    st.sampled_from([None, 2.5]),
    st.sampled_from(["claimed", "claimed", "busy"]),
    st.booleans(),
    st.sampled_from(["list", "awaitable"]),
)
@example("now", "caller", "key", ("op", [1, 2]), False, None, "claimed", False, "list")
@example("sync", "caller", "key", ("op", [1, 2]), False, None, "claimed", False, "list")
@example("later", "caller", "k" * 255, ("op", (1, "a", [2.5])), False, 2.5, "busy", True, "list")
@example("now", "caller", "key", ("op", [1]), True, None, "claimed", False, "awaitable")
@example("sqlite", "caller", "key", ("op", [1]), True, None, "claimed", False, "list")
@example("sqlite", "caller", "key", ("op", [1]), True, None, "claimed", False, "awaitable")
@example("sqlite", "caller", "key", ("op", [1]), True, None, "claimed", False, "value-error")
def test_the_twin_start_does_what_the_reference_does(
    store_kind: str,
    caller: Any,
    key: Any,
    request: Any,
    one_step: bool,
    timeout: Any,
    claim: str,
    wait: bool,
    handler_kind: str,
) -> None:
    script = (store_kind, caller, key, request, one_step, timeout, claim, wait, handler_kind)
    fast = run_start(_idempotency._KeyedCall, *script)
    assert fast == run_start(_idempotency.KeyedCall, *script)
    assert len(fast[2]) <= 1, "done was called once at most, or the start raised"


@pytest.mark.parametrize("one_step", [False, True, 0, 1])
@pytest.mark.parametrize("store_kind", ["now", "later", "sync", "neither", "memory", "sqlite"])
@pytest.mark.parametrize(
    ("caller", "key", "request_"),
    [("caller", "key", request) for request in REQUESTS]
    + [("caller", key, ("op", [1])) for key in KEYS]
    + [(caller, "key", ("op", [1])) for caller in CALLERS],
)
def test_the_twin_start_answers_each_argument_as_the_reference(
    store_kind: str, caller: Any, key: Any, request_: Any, one_step: bool
) -> None:
    """Each key, caller and request of the lists above with the others plain."""
    script = (store_kind, caller, key, request_, one_step, None)
    assert run_start(_idempotency._KeyedCall, *script) == run_start(_idempotency.KeyedCall, *script)


@pytest.mark.parametrize(("wait", "timeout"), [(True, None), (True, 2.5), (False, None)])
@pytest.mark.parametrize(("store_kind", "one_step"), [("now", False), ("sqlite", True)])
def test_the_twin_start_waits_for_a_busy_key_as_the_reference(
    wait: bool, timeout: Any, store_kind: str, one_step: bool
) -> None:
    script = (store_kind, "caller", "key", ("op", [1]), one_step, timeout, "busy", wait)
    fast = run_start(_idempotency._KeyedCall, *script)
    assert fast == run_start(_idempotency.KeyedCall, *script)
    # Still waiting; timed out; or told at once that the key is in progress.
    assert [r[:2] for r in fast[2]] == (
        [] if timeout is None and wait else [("error", "InProgress")]
    )


def test_the_twin_takes_the_common_case_without_a_python_frame_of_the_call() -> None:
    """A plain key and caller, a pair, a handler that returns a plain value: from the
    constructor to the call's end, no method of KeyedCall runs in Python (the handler is
    called from C), on either kind of store, two steps."""
    ran: list[str] = []
    methods = {
        getattr(f, "__func__", f).__code__
        for f in vars(_idempotency.KeyedCall).values()
        if callable(getattr(f, "__func__", f))
    }
    methods.add(_idempotency._checked.__code__)
    assert len(methods) > 15

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in methods:
            ran.append(frame.f_code.co_name)

    for store_kind in ("now", "later", "sync", "memory", "sqlite"):
        ran.clear()
        sys.setprofile(profile)
        try:
            _, seen, results, _ = run_start(
                _idempotency._KeyedCall, store_kind, "caller", "key", ("op", [1]), False, None
            )
        finally:
            sys.setprofile(None)
        assert len(seen) == 1 and results[0][0] == "outcome", store_kind
        assert ran == [], (store_kind, ran)


def test_the_twin_start_leaks_nothing() -> None:
    request = ("op", [1])
    cases = [("now", "key", request), ("sync", "key", request), ("now", "", request),
             ("now", "key", ("op", ["x" * 300]))]  # fmt: skip

    def work(n: int) -> None:
        for i in range(n):
            store_kind, key, request = cases[i % len(cases)]
            run_start(_idempotency._KeyedCall, store_kind, "caller", key, request, False, None)

    moved, live = leaks(work, request, warm=50, runs=300)
    assert moved == [0]
    assert live < 256 * 1024, f"{live} bytes still live after the calls"
