"""``select``: wait on several channel operations, run exactly one (Go's ``selectgo``).

1. Poll: visit the cases in a uniformly random order (Go's ``pollorder``) and run the
   first one that can complete at once. So among ready cases each is chosen with equal
   probability; a nil channel (``None``) is never ready.
2. ``default=True`` and nothing ready: return ``(-1, None, False)`` at once.
3. Otherwise queue one Sudog per non-nil case on its channel and park (wait reason
   ``select``). The first channel operation that pairs with one of them marks the G's
   ``selectdone``, records the case and readies the G; the other Sudogs are skipped by
   their channels from then on and removed here when the G resumes (Go's pass 3).
   With no non-nil case at all the goroutine blocks forever (``select (no cases)``).

The result is ``(index, value, ok)``: the chosen case's index (-1 for default), the value
received (None for a send) and ok, False when a receive got a closed channel's zero value.
Cases are built with :func:`recv` and :func:`send`.
"""

from __future__ import annotations

import random
import types
from collections.abc import Generator
from typing import Any, Final, TypeVar

from gosim import lowlevel
from gosim._chan import Chan
from gosim._core._exceptions import NotInRuntime, SendOnClosedChannel
from gosim.lowlevel import WAIT_SELECT, WAIT_SELECT_NO_CASES, Sudog
from gosim.lowlevel import state as _state

T = TypeVar("T")

RECV: Final = 0
SEND: Final = 1

Case = tuple[int, "Chan[Any] | None", Any]

_PARK = lowlevel.PARK
_PREEMPT = lowlevel.PREEMPT
_budget = lowlevel.OP_BUDGET  # see gosim._chan: the same countdown, kept per module


@types.coroutine
def _preempt_point() -> Generator[Any, Any, None]:
    global _budget
    _budget = lowlevel.OP_BUDGET
    rt = _state.rt
    if rt is not None and rt.preempt_check():
        yield _PREEMPT


def recv(ch: Chan[Any] | None) -> Case:
    """A select case that receives from ``ch`` (``None``: never fires, Go's nil channel)."""
    if ch is not None and not isinstance(ch, Chan):
        raise TypeError(f"select: recv case needs a Chan or None, got {type(ch).__name__}")
    return (RECV, ch, None)


def send(ch: Chan[T] | None, value: T) -> Case:
    """A select case that sends ``value`` on ``ch`` (``None``: never fires)."""
    if ch is not None and not isinstance(ch, Chan):
        raise TypeError(f"select: send case needs a Chan or None, got {type(ch).__name__}")
    return (SEND, ch, value)


@types.coroutine
def select(*cases: Case, default: bool = False) -> Generator[Any, Any, tuple[int, Any, bool]]:
    """Run one ready case, chosen uniformly at random; block until one is ready unless ``default``.

    Returns ``(index, value, ok)`` as described in the module docstring. A send case on
    a closed channel that is chosen raises ``send on closed channel``. A select that
    parked and ends without a case firing (an exception thrown into the goroutine, its
    coroutine closed) takes every one of its sudogs out of the wait queues.

    A generator-based coroutine, on both paths: a native one would cost a trap
    generator per park (about 9% of a parking select); so awaiting the same select
    object twice gives None the second time instead of raising.
    """
    global _budget
    rt = _state.rt
    n = len(cases)
    rnd = rt.rng.random if rt is not None else random.random
    # pollorder: a uniform random permutation (Fisher-Yates on the case indices).
    order: list[int] | tuple[int, ...]
    if n == 2:
        order = (0, 1) if rnd() < 0.5 else (1, 0)
    elif n < 2:
        order = (0,) if n == 1 else ()
    else:
        order = list(range(n))
        for i in range(n - 1, 0, -1):
            j = int(rnd() * (i + 1))
            order[i], order[j] = order[j], order[i]
    for i in order:
        case = cases[i]
        ch = case[1]
        if ch is None:
            continue
        if case[0] == RECV:
            v, ok, received = ch.try_recv()
            if received:
                _budget -= 1
                if _budget <= 0:
                    yield from _preempt_point()
                return i, v, ok
        elif case[0] == SEND:
            if ch.try_send(case[2]):
                _budget -= 1
                if _budget <= 0:
                    yield from _preempt_point()
                return i, None, True
        else:
            raise TypeError("select: cases must be made with gosim.recv or gosim.send")
    if default:
        _budget -= 1
        if _budget <= 0:
            yield from _preempt_point()
        return -1, None, False
    if rt is None or rt.curg is None:
        raise NotInRuntime("select would block outside a gosim goroutine")
    g = rt.curg
    g.selectdone = False
    sudogs: list[Sudog] = []
    for i in range(n):
        kind, ch, value = cases[i]
        if ch is None:
            continue
        sg = Sudog(g, ch, i, value)
        if kind == RECV:
            ch._recvq.append(sg)
        else:
            ch._sendq.append(sg)
        sudogs.append(sg)
    if not sudogs:
        # Go's `select {}` waits as "select (no cases)"; a select whose cases are all
        # nil channels parks in selectgo as a plain "select".
        g.waitreason = WAIT_SELECT_NO_CASES if n == 0 else WAIT_SELECT
        yield _PARK  # never readied: blocks forever, as in Go
        raise AssertionError("unreachable: select with no cases was woken")  # pragma: no cover
    g.waitreason = WAIT_SELECT
    fired: Sudog | None = None
    try:
        fired = yield _PARK
    finally:
        # Go's pass 3: every sudog but the one that fired leaves its queue; all of them
        # when the park ended by an exception thrown in or the coroutine closed.
        g.selectdone = False
        for sg in sudogs:
            if sg is not fired:
                ch = sg.ch
                q = ch._recvq if cases[sg.caseidx][0] == RECV else ch._sendq
                try:
                    q.remove(sg)
                except ValueError:  # already taken out by a dequeue that skipped it
                    pass
    assert fired is not None
    i = fired.caseidx
    if cases[i][0] == SEND:
        if not fired.ok:
            raise SendOnClosedChannel("send on closed channel")
        return i, None, True
    return i, fired.elem, fired.ok
