"""gosim._internals.trap: the C twin (an awaitable object) against the generator it
replaces, driven by hand as the scheduler drives a goroutine: the trap is yielded once,
the resume value is what the await evaluates to, and what is thrown in at the yield is
raised in the awaiting frame."""

from __future__ import annotations

from typing import Any

import pytest

from gosim._core import _state
from gosim._core._accel import speedups

TRAPS = [pytest.param(_state._trap_py, id="python")]
if speedups is not None:
    TRAPS.append(pytest.param(speedups.trap, id="c"))


async def _awaits(trap: Any, what: Any, log: list[Any]) -> Any:
    try:
        got = await trap(what)
    except ValueError as exc:
        log.append(("caught", str(exc)))
        got = await trap("again")
    log.append(("got", got))
    return got


@pytest.mark.parametrize("trap", TRAPS)
def test_a_trap_yields_once_and_evaluates_to_the_resume_value(trap: Any) -> None:
    log: list[Any] = []
    coro = _awaits(trap, ("park", 1), log)
    assert coro.send(None) == ("park", 1)
    with pytest.raises(StopIteration) as stop:
        coro.send(42)
    assert stop.value.value == 42 and log == [("got", 42)]


@pytest.mark.parametrize("trap", TRAPS)
def test_what_is_thrown_in_at_the_yield_is_raised_in_the_awaiting_frame(trap: Any) -> None:
    log: list[Any] = []
    coro = _awaits(trap, "park", log)
    assert coro.send(None) == "park"
    assert coro.throw(ValueError("boom")) == "again"
    with pytest.raises(StopIteration):
        coro.send("late")
    assert log == [("caught", "boom"), ("got", "late")]
    closed = _awaits(trap, "park", [])
    closed.send(None)
    closed.close()  # GeneratorExit at the yield: the coroutine ends
    with pytest.raises(RuntimeError):
        closed.send(None)


@pytest.mark.parametrize("trap", TRAPS)
def test_a_trap_also_speaks_the_iterator_protocol(trap: Any) -> None:
    made = trap("x")  # the generator is its own iterator (types.coroutine)
    t = made.__await__() if hasattr(made, "__await__") else made
    assert next(t) == "x"
    with pytest.raises(StopIteration) as stop:
        t.send("resumed")
    assert stop.value.value == "resumed"
