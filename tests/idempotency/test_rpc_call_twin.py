"""The C twin of a keyed RPC call (``rpc._dispatch._RPCCall``, a subclass of
``RPCCall`` with its common case and its reply in C) against ``RPCCall`` itself, at the
call's end.

Each is given the same (outcome, error) to finish with: the calls (each the Later the
server waits on) must end the same way (the same reply bytes, or the same exception),
``finish`` must return or raise the same, and the dispatcher's statistics must move the
same. The common case must not reach the reference at all.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import gosim
from idempotency import Idempotency, InvalidKey, KeyReused, StoreUnavailable
from idempotency._accel import speedups
from idempotency._outcome import Outcome
from idempotency.rpc import _dispatch
from idempotency.rpc._dispatch import Dispatcher, RPCCall
from idempotency.stores import MemoryStore
from netframe import Later

from ._leaks import leaks

pytestmark = pytest.mark.skipif(
    speedups is None, reason="idempotency._speedups not in use (not built, or GOSIM_PURE_PYTHON=1)"
)

MAX_MSGID = 2**32 - 1


class OutcomeSubclass(Outcome):
    __slots__ = ()


def outcome(kind: type[Outcome], ok: Any, payload: Any, replayed: Any) -> Outcome:
    return kind(ok, payload, replayed, 7)


outcomes = st.builds(
    outcome,
    st.sampled_from([Outcome, Outcome, OutcomeSubclass]),
    st.sampled_from([True, True, False, 1, 0]),
    st.one_of(
        st.binary(min_size=1, max_size=40).map(msgpack.packb),
        st.just(b"\xa5hello"),
        st.just(b""),
        st.just(bytearray(b"\x01")),
        st.just(msgpack.packb([3, "final", None])),
    ),
    st.sampled_from([False, False, True, 0]),
)
errors = st.one_of(
    st.none(),
    st.none(),
    st.sampled_from([StoreUnavailable("down"), KeyReused("caller", "k-1"), InvalidKey("bad")]),
)
msgids = st.one_of(
    st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, MAX_MSGID]),
    st.integers(0, MAX_MSGID),
)


def rpc_call(cls: Any, dispatcher: Dispatcher, msgid: Any, deadline: float = math.inf) -> Any:
    """A keyed RPC call of ``cls`` as the dispatcher makes one, not begun."""
    call = cls(
        Idempotency(MemoryStore()), "caller", "k-1", ("echo", []), None,
        wait=False, timeout=None, ctx=None, one_step=False,
    )  # fmt: skip
    call.dispatcher = dispatcher
    call.spec = None
    call.msgid = msgid
    call.method_ctx = None
    call.deadline = deadline
    call.cancel_ctx = None
    return call


def run(
    cls: Any, msgid: Any, args: tuple[Any, ...], settled_before: str | None, taker: bool = False
) -> Any:
    """What one call's end does: the call's settle, finish's own end, the statistics,
    and with ``taker`` what the taker given by ``reply_to`` (the server's way) was
    handed."""
    dispatcher = Dispatcher()
    call = rpc_call(cls, dispatcher, msgid)
    handed: list[Any] = []
    if taker:
        call.reply_to(lambda arg, later: handed.append((arg, later is call, later.result())), 7)
    if settled_before == "replied":
        call.settle(b"earlier")
    elif settled_before == "cancelled":
        call.cancel()
    try:
        returned: Any = ("returned", call.finish(*args))
    except Exception as exc:
        returned = ("raised", type(exc), str(exc))
    try:
        end: Any = ("reply", call.result()) if call.done() else ("pending",)
    except BaseException as exc:
        end = ("failed", type(exc))
    return returned, end, dispatcher.statistics(), handed, call.data is None


@given(
    outcomes, errors, msgids, st.sampled_from([None, None, "replied", "cancelled"]), st.booleans()
)
@example(Outcome(True, b"\xa1x", False, 1), None, 5, None, False)  # the common case
@example(Outcome(True, b"\xa1x", False, 1), None, 5, None, True)  # ... the server's way
@example(Outcome(True, b"", False, 1), None, 5, None, False)  # an empty payload: nil on the wire
@example(Outcome(True, b"\xa1x", False, 1), None, 5, "replied", True)
@example(Outcome(True, b"\xa1x", False, 1), None, 5, "cancelled", False)
@example(Outcome(True, b"\xa1x", True, 1), None, 5, None, True)  # a replay: counted
@example(Outcome(False, b"\x93\x03\xa1x\xc0", False, 1), None, 5, None, True)
def test_the_twin_answers_as_the_reference(
    out: Outcome,
    error: BaseException | None,
    msgid: int,
    settled_before: str | None,
    taker: bool,
) -> None:
    args = (None, error) if error is not None else (out, None)
    twin = run(_dispatch._RPCCall, msgid, args, settled_before, taker)
    assert twin == run(RPCCall, msgid, args, settled_before, taker)
    if taker and settled_before is None and twin[0][0] == "returned":
        assert twin[3] == [(7, True, twin[1][1])]  # handed its reply once, taker let go


@given(msgids, st.binary(min_size=1, max_size=300))
@example(128, b"\xc0")
@example(256, b"\xc0")
@example(65536, b"\xc0")
def test_the_common_case_at_every_msgid_width(msgid: int, payload: bytes) -> None:
    """A value recorded now, the msgid of every encoded width: the same bytes, from the
    twin alone."""
    args = (Outcome(True, payload, False, 1), None)
    twin = run(_dispatch._RPCCall, msgid, args, None)
    assert twin == run(RPCCall, msgid, args, None)
    assert twin[1] == ("reply", msgpack.packb([1, msgid, None, None])[:-1] + payload)


@pytest.mark.parametrize("msgid", [-1, MAX_MSGID + 1, True, 2.0, "5"])
def test_a_msgid_the_wire_cannot_carry_goes_to_the_reference(msgid: Any) -> None:
    args = (Outcome(True, b"\xa1x", False, 1), None)
    twin = run(_dispatch._RPCCall, msgid, args, None)
    assert twin == run(RPCCall, msgid, args, None)
    assert twin[0][0] == "raised"


class LooksLikeAnOutcome:
    """Not an Outcome, with what the reference reads of one."""

    def __init__(self) -> None:
        self.ok = True
        self.replayed = False
        self.payload = b"\xa4duck"


def test_what_is_not_an_outcome_goes_to_the_reference() -> None:
    args = (LooksLikeAnOutcome(), None)
    twin = run(_dispatch._RPCCall, 4, args, None)
    assert twin == run(RPCCall, 4, args, None)
    assert twin[1] == ("reply", b"\x94\x01\x04\xc0\xa4duck")


@pytest.mark.parametrize("deadline", [0.0, 1e9])
def test_a_call_with_a_deadline_goes_to_the_reference(deadline: float) -> None:
    """Past its deadline (DEADLINE_EXCEEDED, counted) or before it: the same answer."""
    args = (Outcome(True, b"\xa1x", False, 1), None)
    ends = []
    for cls in (_dispatch._RPCCall, RPCCall):
        dispatcher = Dispatcher()

        async def main(cls: Any = cls, dispatcher: Dispatcher = dispatcher) -> None:
            call = rpc_call(cls, dispatcher, 5, deadline)
            call.finish(*args)
            ends.append((call.result(), dispatcher.statistics()))

        gosim.run(main, procs=1, virtual_time=True)
    assert ends[0] == ends[1]


def test_a_keyed_call_is_answered_without_the_reference() -> None:
    """Through the dispatcher, a keyed call recorded now is answered by the twin alone:
    ``RPCCall.finish`` runs only for the replay, and the reply is the reference's bytes."""
    finishes: list[Any] = []
    code = RPCCall.finish.__code__

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            finishes.append(frame.f_locals["outcome"].replayed)

    request = msgpack.packb([0, 9, "echo", ["hi"], {"key": "k-1"}])
    replies: list[Any] = []

    async def main() -> None:
        dispatcher = Dispatcher(idempotency=Idempotency(MemoryStore()))
        dispatcher.register(lambda text: text, "echo", idempotent=True)
        for _ in range(2):
            reply = dispatcher.handle_payload(request)
            replies.append(reply if type(reply) is bytes else await reply)

    sys.setprofile(profile)
    try:
        gosim.run(main)
    finally:
        sys.setprofile(None)
    assert replies[0] == b"\x94\x01\x09\xc0\xa2hi"
    assert replies[1] == b"\x95\x01\x09\xc0\xa2hi\x81\xa8replayed\xc3"  # by the reference
    assert finishes == [True]


def test_the_twin_leaks_nothing() -> None:
    """Its fast path and each hand-over, many times: no object left behind, no
    reference count creeping."""
    payload = b"\xa5hello"
    dispatcher = Dispatcher()
    twin = _dispatch._RPCCall

    def work(n: int) -> None:
        for i in range(n):
            rpc_call(twin, dispatcher, i).finish(Outcome(True, payload, False, i), None)
            rpc_call(twin, dispatcher, i).finish(Outcome(True, payload, True, i), None)
            rpc_call(twin, dispatcher, i).finish(None, StoreUnavailable("down"))
            settled = rpc_call(twin, dispatcher, i)
            settled.settle(b"x")
            try:
                settled.finish(Outcome(True, payload, False, i), None)
            except RuntimeError:
                pass

    moved, live = leaks(work, payload, warm=300, runs=3000)
    assert moved == [0]
    assert live < 64 * 1024, f"{live} bytes still live after the calls"


def test_the_twin_is_a_later_and_the_reference_what_pure_python_runs() -> None:
    assert _dispatch._RPCCall is not RPCCall
    assert _dispatch._RPCCall.__bases__ == (RPCCall,)
    assert issubclass(RPCCall, Later)
