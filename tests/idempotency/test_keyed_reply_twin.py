"""The C twin of a keyed RPC call's reply callback (``_speedups.KeyedReply``) against
its Python reference (``rpc._dispatch._py_keyed_reply``, a partial of the dispatcher's
``_keyed_replied``).

Each is given the same (outcome, error) for a Later of its own: the Laters must end the
same way (the same reply bytes, or the same exception), the call must return or raise
the same, and the dispatcher's statistics must move the same. The common case must not
reach the reference at all.
"""

from __future__ import annotations

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
from idempotency.rpc._dispatch import Dispatcher, _py_keyed_reply
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


def run(make: Any, msgid: Any, args: tuple[Any, ...], settled_before: str | None) -> Any:
    """What one callback does: the Later's end, the call's own end, the statistics."""
    dispatcher = Dispatcher()
    later = Later()
    if settled_before == "replied":
        later.settle(b"earlier")
    elif settled_before == "cancelled":
        later.cancel()
    try:
        returned: Any = ("returned", make(dispatcher._keyed_replied, later, msgid)(*args))
    except Exception as exc:
        returned = ("raised", type(exc), str(exc))
    try:
        end: Any = ("reply", later.result()) if later.done() else ("pending",)
    except BaseException as exc:
        end = ("failed", type(exc))
    return returned, end, dispatcher.statistics()


@given(outcomes, errors, msgids, st.sampled_from([None, None, "replied", "cancelled"]))
@example(Outcome(True, b"\xa1x", False, 1), None, 5, None)  # the common case
@example(Outcome(True, b"", False, 1), None, 5, None)  # an empty payload is nil on the wire
@example(Outcome(True, b"\xa1x", False, 1), None, 5, "replied")
@example(Outcome(True, b"\xa1x", False, 1), None, 5, "cancelled")
@example(Outcome(True, b"\xa1x", True, 1), None, 5, None)  # a replay: counted
@example(Outcome(False, b"\x93\x03\xa1x\xc0", False, 1), None, 5, None)
def test_the_twin_answers_as_the_reference(
    out: Outcome, error: BaseException | None, msgid: int, settled_before: str | None
) -> None:
    args = (None, error) if error is not None else (out, None)
    assert run(speedups.KeyedReply, msgid, args, settled_before) == run(
        _py_keyed_reply, msgid, args, settled_before
    )


@given(msgids, st.binary(min_size=1, max_size=300))
@example(128, b"\xc0")
@example(256, b"\xc0")
@example(65536, b"\xc0")
def test_the_common_case_at_every_msgid_width(msgid: int, payload: bytes) -> None:
    """A value recorded now, the msgid of every encoded width: the same bytes, from the
    twin alone."""
    args = (Outcome(True, payload, False, 1), None)
    twin = run(speedups.KeyedReply, msgid, args, None)
    assert twin == run(_py_keyed_reply, msgid, args, None)
    assert twin[1] == ("reply", msgpack.packb([1, msgid, None, None])[:-1] + payload)


@pytest.mark.parametrize("msgid", [-1, MAX_MSGID + 1, True, 2.0, "5"])
def test_a_msgid_the_wire_cannot_carry_goes_to_the_reference(msgid: Any) -> None:
    args = (Outcome(True, b"\xa1x", False, 1), None)
    twin = run(speedups.KeyedReply, msgid, args, None)
    assert twin == run(_py_keyed_reply, msgid, args, None)
    assert twin[0][0] == "raised"


class LooksLikeAnOutcome:
    """Not an Outcome, with what the reference reads of one."""

    def __init__(self) -> None:
        self.ok = True
        self.replayed = False
        self.payload = b"\xa4duck"


def test_what_is_not_an_outcome_goes_to_the_reference() -> None:
    args = (LooksLikeAnOutcome(), None)
    twin = run(speedups.KeyedReply, 4, args, None)
    assert twin == run(_py_keyed_reply, 4, args, None)
    assert twin[1] == ("reply", b"\x94\x01\x04\xc0\xa4duck")


def test_other_call_shapes_go_to_the_reference() -> None:
    """Keyword arguments and a wrong count reach ``_keyed_replied`` as given."""
    seen: list[Any] = []

    def replied(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return "reference"

    later = Later()
    twin = speedups.KeyedReply(replied, later, 3)
    good = Outcome(True, b"\xa1x", False, 1)
    assert twin(good) == "reference"
    assert twin(good, error=None) == "reference"
    assert twin(good, None, 1) == "reference"
    inf = float("inf")
    assert seen == [
        ((later, 3, inf, None, good), {}),
        ((later, 3, inf, None, good), {"error": None}),
        ((later, 3, inf, None, good, None, 1), {}),
    ]
    assert not later.done()


def test_a_keyed_call_is_answered_without_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the dispatcher, a keyed call recorded now is answered by the twin alone:
    ``_keyed_replied`` is never called, and the reply is the reference's bytes."""
    calls: list[Any] = []
    original = Dispatcher._keyed_replied

    def spy(self: Dispatcher, *args: Any) -> None:
        calls.append(args)
        original(self, *args)

    monkeypatch.setattr(Dispatcher, "_keyed_replied", spy)
    request = msgpack.packb([0, 9, "echo", ["hi"], {"key": "k-1"}])
    replies: list[Any] = []

    async def main() -> None:
        dispatcher = Dispatcher(idempotency=Idempotency(MemoryStore()))
        dispatcher.register(lambda text: text, "echo", idempotent=True)
        for _ in range(2):
            reply = dispatcher.handle_payload(request)
            replies.append(reply if type(reply) is bytes else await reply)

    gosim.run(main)
    assert replies[0] == b"\x94\x01\x09\xc0\xa2hi"
    assert replies[1] == b"\x95\x01\x09\xc0\xa2hi\x81\xa8replayed\xc3"  # by the reference
    assert len(calls) == 1


def test_the_twin_leaks_nothing() -> None:
    """Its fast path and each hand-over, many times: no object left behind, no
    reference count creeping."""
    payload = b"\xa5hello"
    dispatcher = Dispatcher()

    def work(n: int) -> None:
        for i in range(n):
            speedups.KeyedReply(dispatcher._keyed_replied, Later(), i)(
                Outcome(True, payload, False, i), None
            )
            speedups.KeyedReply(dispatcher._keyed_replied, Later(), i)(
                Outcome(True, payload, True, i), None
            )
            speedups.KeyedReply(dispatcher._keyed_replied, Later(), i)(
                None, StoreUnavailable("down")
            )
            settled = Later()
            settled.settle(b"x")
            try:
                speedups.KeyedReply(dispatcher._keyed_replied, settled, i)(
                    Outcome(True, payload, False, i), None
                )
            except RuntimeError:
                pass

    moved, live = leaks(work, payload, warm=300, runs=3000)
    assert moved == [0]
    assert live < 64 * 1024, f"{live} bytes still live after the calls"


def test_the_reference_is_what_pure_python_runs() -> None:
    assert _dispatch._keyed_reply is speedups.KeyedReply
    assert _py_keyed_reply(print, Later(), 1).args[2:] == (float("inf"), None)
