"""The channel, select and waiter awaitables driven by hand, as a coroutine that
delegates to them drives them (``send``, ``__next__``, ``throw``, ``close``), on both
paths: what they finish with arrives in ``StopIteration.value`` (None, a tuple and an
exception instance among them, each as itself), and what is thrown in before they
start is raised at once. The C ops answer these through the generator helpers of
``gosim/_speedups_common.c.h``; the pure path's are coroutines."""

from __future__ import annotations

from typing import Any

import pytest

from gosim import Chan, lowlevel, recv, select


def _finish(op: Any, by_next: bool = False) -> Any:
    with pytest.raises(StopIteration) as stop:
        if by_next:
            # An awaitable's iterator (the pure path's wait is a generator: itself).
            next(op.__await__() if hasattr(op, "__await__") else op)
        else:
            op.send(None)
    return stop.value.value


@pytest.mark.parametrize("by_next", [False, True], ids=["send", "next"])
def test_a_ready_channel_op_finishes_with_its_value(by_next: bool) -> None:
    ch: Chan[Any] = Chan(4)
    error = KeyError("an exception as a value")
    for value in (5, None, (1, 2), error):
        assert ch.try_send(value)
    assert _finish(ch.recv(), by_next) == 5
    assert _finish(ch.recv(), by_next) is None
    assert _finish(ch.recv2(), by_next) == ((1, 2), True)
    assert _finish(ch.recv(), by_next) is error
    ch.close()
    assert _finish(ch.recv2(), by_next) == (None, False)


@pytest.mark.parametrize("by_next", [False, True], ids=["send", "next"])
def test_a_ready_select_finishes_with_its_case(by_next: bool) -> None:
    ch: Chan[Any] = Chan(1)
    assert ch.try_send((3, 4))
    assert _finish(select(recv(ch)), by_next) == (0, (3, 4), True)
    assert _finish(select(recv(ch), default=True), by_next) == (-1, None, False)


@pytest.mark.parametrize("by_next", [False, True], ids=["send", "next"])
def test_a_settled_wait_finishes_with_the_settled_value(by_next: bool) -> None:
    for value in (7, None, ("a", "b")):
        w = lowlevel.Waiter()
        w.settle(value)
        assert _finish(w.wait(), by_next) == value


@pytest.mark.parametrize("form", ["instance", "class", "class and value"])
def test_what_is_thrown_into_an_unstarted_op_is_raised(form: str) -> None:
    ch: Chan[int] = Chan(1)
    w = lowlevel.Waiter()
    for op in (ch.recv(), ch.recv2(), select(recv(ch)), w.wait()):
        exc = KeyError("thrown")
        with pytest.raises(KeyError) as raised:
            if form == "instance":
                op.throw(exc)
            elif form == "class":
                op.throw(KeyError)
            else:
                op.throw(KeyError, exc)
        if form != "class":
            assert raised.value is exc
        assert op.close() is None
    # Nothing was taken from the channel nor left queued on it: a value sent now is
    # the next receive's.
    assert ch.try_send(9)
    assert _finish(ch.recv()) == 9
