"""The C twin of a two-step call's continuation (``_speedups.TwoStepCall``) against its
Python reference (``_idempotency._py_continuation`` and the Idempotency methods it leads
through).

A scripted CallbackStore answers the claim and the record as hypothesis draws them (now,
in the caller's frame, or later, from a goroutine); the handler returns or raises what is
drawn. The same script runs through each continuation on a seeded runtime, and
everything observable must be the same: what the store was asked (the completion's every
field), what the handler was given, what ``done`` got (the outcome's every slot, or the
error), the claims still held, and the store's releases.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gosim
from idempotency import ApplicationError, Idempotency, StaleClaim, StoreUnavailable, _idempotency
from idempotency._accel import speedups
from idempotency._record import COMPLETED, IN_PROGRESS, ClaimKind, ClaimResult, Record
from idempotency.stores import CallbackStore, Completion, Effect, StoreStatistics

pytestmark = pytest.mark.skipif(
    speedups is None, reason="idempotency._speedups not in use (not built, or GOSIM_PURE_PYTHON=1)"
)

FP = b"\x07" * 32
OTHER_FP = b"\x08" * 32


class ScriptedStore(CallbackStore):
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

    def claim_later(
        self, caller: str, key: str, fingerprint: bytes, lease: float, done: Any
    ) -> None:
        self.log.append(("claim", caller, key, fingerprint, lease))
        how = self.claim_answer
        if how == "error":
            self._answer(done, None, StoreUnavailable("the store is down"))
            return
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
        self._answer(done, res, None)

    def complete_later(
        self, caller: str, key: str, fence: int, completion: Completion, done: Any
    ) -> None:
        fields = tuple((type(x).__name__, x) for x in completion)
        self.log.append(("complete", caller, key, fence, type(completion).__name__, fields))
        how = self.complete_answer
        if how == "stale":
            self._answer(done, None, StaleClaim(caller, key, fence, "taken over"))
        elif how == "down":
            self._answer(done, None, StoreUnavailable("the store went down"))
        else:
            # An effect's result stands in for what the effect would have returned.
            payload = b"\xa6effect" if completion.payload is None else completion.payload
            rec = Record(COMPLETED, FP, fence, 1e9, completion.ok, payload)
            self._answer(done, rec, None)

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


def _describe(outcome: Any, error: BaseException | None) -> Any:
    if error is not None:
        return ("error", type(error).__name__, str(error))
    slots = {name: getattr(outcome, name) for name in type(outcome).__slots__}
    slots["_value"] = slots["_value"] is _idempotency._NOT_DECODED
    return ("outcome", type(outcome).__name__, sorted(slots.items()))


def run_script(
    continuation: Any, claim: str, complete: str, now: bool, handler_kind: str, one_step: bool
) -> Any:
    """Everything observable of one two-step call through ``continuation``."""
    store = ScriptedStore(claim, complete, now)
    idem = Idempotency(store, max_result_bytes=200, wait=False)
    idem._keeper = False  # the scripted store cannot renew: no keep-alive goroutine
    seen: list[Any] = []
    results: list[Any] = []

    def handler(call: Any) -> Any:
        seen.append((type(call).__name__, [(n, getattr(call, n)) for n in type(call).__slots__]))
        return _returns(handler_kind)

    async def main() -> None:
        idem._two_step(
            "caller", "key", "op", [1, 2], FP, handler, False, None, None, one_step,
            lambda outcome, error: results.append(_describe(outcome, error)),
        )  # fmt: skip
        for _ in range(20):
            await gosim.gosched()

    saved = _idempotency._continuation
    _idempotency._continuation = continuation
    try:
        gosim.run(main, procs=1, seed=3)
    finally:
        _idempotency._continuation = saved
    return store.log, seen, results, sorted(idem._holders.items())


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["claimed", "claimed", "claimed", "replay", "busy", "mismatch", "error"]),
    st.sampled_from(["record", "record", "stale", "down"]),
    st.booleans(),
    st.sampled_from(HANDLER_KINDS),
    st.booleans(),
)
@example("claimed", "record", False, "list", False)
@example("claimed", "record", True, "too-big", False)
@example("claimed", "stale", False, "int", False)
@example("claimed", "record", False, "awaitable", True)
@example("claimed", "down", True, "app-error", False)
@example("claimed", "record", True, "value-error", False)
@example("claimed", "record", False, "effect", False)
def test_the_c_continuation_does_what_the_reference_does(
    claim: str, complete: str, now: bool, handler_kind: str, one_step: bool
) -> None:
    fast = run_script(speedups.TwoStepCall, claim, complete, now, handler_kind, one_step)
    ref = run_script(_idempotency._py_continuation, claim, complete, now, handler_kind, one_step)
    assert fast == ref
    assert fast[2], "done was called"  # every script ends within the rounds given


def test_the_c_continuation_is_in_place() -> None:
    assert _idempotency._continuation is speedups.TwoStepCall


def test_the_c_continuation_refuses_a_third_answer_and_bad_calls() -> None:
    got: list[Any] = []

    async def main() -> None:
        store = ScriptedStore("claimed", "record", True)
        idem = Idempotency(store, wait=False)
        idem._keeper = False
        cont = speedups.TwoStepCall(
            idem, "c", "k", "op", [], FP, lambda call: 1, False, None, None, False,
            lambda outcome, error: got.append(outcome.value),
        )  # fmt: skip
        store.claim_later("c", "k", FP, 5.0, cont)
        with pytest.raises(RuntimeError, match="after its call was over"):
            cont(None, None)
        with pytest.raises(TypeError, match=r"takes \(result, error\)"):
            cont(None)

    gosim.run(main, procs=1)
    assert got == [1]
    with pytest.raises(TypeError, match="12 positional arguments"):
        speedups.TwoStepCall(1, 2)


def test_the_c_continuation_leaks_nothing() -> None:
    """Its fast path and each hand-over, many times: nothing is left live and no
    reference count creeps."""
    kinds = [("record", "list"), ("record", "value-error"), ("stale", "int"),
             ("record", "too-big"), ("record", "app-error")]  # fmt: skip

    def work(n: int) -> None:
        for i in range(n):
            complete, handler_kind = kinds[i % len(kinds)]
            run_script(speedups.TwoStepCall, "claimed", complete, True, handler_kind, False)

    work(50)
    gc.collect()
    refs = sys.getrefcount(FP)
    tracemalloc.start()
    try:
        work(300)
        gc.collect()
        live = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert sys.getrefcount(FP) == refs
    assert live < 256 * 1024, f"{live} bytes still live after the calls"
