"""``select``: wait on several channel operations, run exactly one (Go's ``selectgo``).

1. Poll: visit the cases in a uniformly random order (Go's ``pollorder``) and run the
   first one that can complete at once. So among ready cases each is chosen with equal
   probability; a nil channel (``None``) is never ready. The order is drawn from the
   runtime's ``rng`` (``random.random`` outside a runtime): one draw for two cases,
   ``n - 1`` for ``n`` (Fisher-Yates), so a seeded run chooses the same cases each time.
2. ``default=True`` and nothing ready: return ``(-1, None, False)`` at once.
3. Otherwise queue one Sudog per non-nil case on its channel and park (wait reason
   ``select``). The first channel operation that pairs with one of them marks the G's
   ``selectdone``, records the case and readies the G; the other Sudogs are skipped by
   their channels from then on and removed here when the G resumes (Go's pass 3).
   With no non-nil case at all the goroutine blocks forever (``select (no cases)`` when
   there are no cases, ``select`` when every channel is nil).

The result is ``(index, value, ok)``: the chosen case's index (-1 for default), the value
received (None for a send) and ok, False when a receive got a closed channel's zero value.

Cases are built with :func:`recv` and :func:`send`; a case that is not one of their
tuples raises TypeError when the poll reaches it. A send case chosen on a closed channel
raises ``send on closed channel`` (:class:`gosim.SendOnClosedChannel`), whether it was
chosen in the poll or woke the select by the channel's close. A select that would park
outside a goroutine raises :class:`gosim.NotInRuntime`. A select that parked and ends
without a case firing (an exception thrown into the goroutine, its coroutine closed)
takes every one of its Sudogs out of the wait queues.

``select(...)`` returns an awaitable that does nothing until awaited, and is awaited
once: a second ``await`` raises RuntimeError, and one dropped unawaited warns
(RuntimeWarning), as for a coroutine and the channel operations. (Until issue 17 the
select was a generator-based coroutine whose second ``await`` gave None.)

This module's functions are the reference implementation. When the C accelerator is
built, ``select``, ``recv`` and ``send`` are their twins in
``gosim/_speedups_select.c.h`` (same rules, same draws from the rng, same queues); keep
the two in step.
``tests/gosim/test_select_paths.py`` runs both on the same programs and compares them.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

from gosim import _chan, _internals
from gosim._chan import Chan, _preempt_point
from gosim._core._exceptions import NotInRuntime, SendOnClosedChannel, throw
from gosim._internals import G, Sudog, speedups
from gosim._internals import state as _state
from gosim._internals import trap as _trap
from gosim.lowlevel import WAIT_SELECT, WAIT_SELECT_NO_CASES

T = TypeVar("T")

RECV: Final = 0
SEND: Final = 1

Case = tuple[int, "Chan[Any] | None", Any]

_PARK = _internals.PARK
_BAD_CASE: Final = "select: cases must be made with gosim.recv or gosim.send"


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


async def select(*cases: Case, default: bool = False) -> tuple[int, Any, bool]:
    """Run one ready case, chosen uniformly at random; block until one is ready unless ``default``.

    Returns ``(index, value, ok)`` as described in the module docstring. A send case on
    a closed channel that is chosen raises ``send on closed channel``. A select that
    parked and ends without a case firing (an exception thrown into the goroutine, its
    coroutine closed) takes every one of its sudogs out of the wait queues.
    """
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
        if type(case) is not tuple or len(case) != 3:
            raise TypeError(_BAD_CASE)
        kind, ch, value = case
        if ch is None:
            continue
        if not isinstance(ch, Chan):
            raise TypeError(_BAD_CASE)
        if kind == RECV:
            v, ok, received = ch.try_recv()
            if received:
                # gosim._chan's op budget, one countdown for channels and select.
                _chan._budget -= 1
                if _chan._budget <= 0:
                    await _preempt_point()
                return i, v, ok
        elif kind == SEND:
            if ch.try_send(value):
                # gosim._chan's op budget, one countdown for channels and select.
                _chan._budget -= 1
                if _chan._budget <= 0:
                    await _preempt_point()
                return i, None, True
        else:
            raise TypeError(_BAD_CASE)
    if default:
        _chan._budget -= 1
        if _chan._budget <= 0:
            await _preempt_point()
        return -1, None, False
    # Parking (Go's passes 2 and 3) is in helpers; the poll above runs on every select
    # and stays written out in this frame, where a call per case would cost, and so does
    # the result below, which a select that parks reaches every time.
    if rt is None or rt.curg is None:
        raise NotInRuntime("select would block outside a gosim goroutine")
    g = rt.curg
    sudogs = _enqueue(g, cases)
    if not sudogs:
        await _block_forever(g, n)
    g.waitreason = WAIT_SELECT
    fired: Any = None
    try:
        fired = await _trap(_PARK)
    finally:
        _dequeue_unfired(g, cases, sudogs, fired)
    if fired not in sudogs:
        raise throw(f"select: goroutine {g.goid} woken without a case that fired")
    i = fired.caseidx
    if cases[i][0] == SEND:
        if not fired.ok:
            raise SendOnClosedChannel("send on closed channel")
        return i, None, True
    return i, fired.elem, fired.ok


def _enqueue(g: G, cases: tuple[Case, ...]) -> list[Sudog]:
    """Queue one Sudog of g per non-nil case on its channel (Go's pass 2), in case
    order, with g's ``selectdone`` cleared; the Sudogs, in that order (none when every
    channel is nil)."""
    g.selectdone = False
    sudogs: list[Sudog] = []
    # Every case was checked by the poll, which visits them all when none is ready.
    for i, (kind, ch, value) in enumerate(cases):
        if ch is None:
            continue
        sg = Sudog(g, ch, i, value)
        if kind == RECV:
            ch._recvq.append(sg)
        else:
            ch._sendq.append(sg)
        sudogs.append(sg)
    return sudogs


async def _block_forever(g: G, ncases: int) -> NoReturn:
    """Park g for good: a select with no case that can ever fire."""
    # Go's `select {}` waits as "select (no cases)"; a select whose cases are all
    # nil channels parks in selectgo as a plain "select".
    g.waitreason = WAIT_SELECT_NO_CASES if ncases == 0 else WAIT_SELECT
    await _trap(_PARK)  # never readied: blocks forever, as in Go
    raise throw(f"select: goroutine {g.goid} woken from a select that blocks forever")


def _dequeue_unfired(g: G, cases: tuple[Case, ...], sudogs: list[Sudog], fired: Any) -> None:
    """Go's pass 3: every Sudog but the one that fired is out of its channel's queue
    (all of them when none fired: the park ended by an exception thrown in or the
    coroutine closed), and g's ``selectdone`` is cleared."""
    g.selectdone = False
    for sg in sudogs:
        if sg is not fired:
            ch = sg.ch
            q = ch._recvq if cases[sg.caseidx][0] == RECV else ch._sendq
            try:
                q.remove(sg)
            except ValueError:  # already taken out by a dequeue that skipped it
                pass


# The pure-Python functions stay importable under these names (the tests run them
# against the C ones); the public names are the C twins when the accelerator is built.
py_select = select
py_recv = recv
py_send = send

if speedups is not None:
    import _random

    speedups.configure_select(
        WAIT_SELECT, WAIT_SELECT_NO_CASES, random.random, _random.Random.random, RECV, SEND
    )
    if not TYPE_CHECKING:
        select = speedups.select
        recv = speedups.recv
        send = speedups.send
