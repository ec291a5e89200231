"""What every room of the scheduler shares: the per-thread state, the traps, the sizes.

A goroutine talks to the driver by yielding a *trap* from its coroutine (:func:`_trap`):
``PARK`` (marked waiting, someone will ``goready`` it), ``GOSCHED`` and ``PREEMPT`` (to
the global queue), or a syscall or trio call record (``_syscall``). The driver sets
:data:`_state` ``.rt`` while it steps goroutines, which is how gosim operations find
their scheduler (:func:`current_runtime`).

The sizes below are defined here once; the C accelerator receives them (and the traps,
errors and the G status table) through ``speedups.configure`` at import, so it cannot
drift from them.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, Final

import outcome
import trio

from gosim._core import _exceptions, _g
from gosim._core._accel import speedups
from gosim._core._exceptions import NotInRuntime
from gosim._core._g import G

if TYPE_CHECKING:
    from gosim._core._runtime import Runtime

RUNQ_SIZE: Final = 256  # Go's len(p.runq)
GFREE_LOCAL_MAX: Final = 64  # gfput moves a batch to the global list beyond this
PERIODIC_MASK: Final = 255  # timers and trio are checked every 256 switches
OP_BUDGET: Final = 128  # fast operations between two preemption checks

# Traps: what a goroutine's coroutine yields to the driver.
PARK: Final = "park"
GOSCHED: Final = "gosched"
PREEMPT: Final = "preempt"


class _Goexit(BaseException):
    """Raised by :func:`goexit` to unwind the goroutine (Go's runtime.Goexit)."""


@types.coroutine
def _trap_py(what: Any) -> Generator[Any, Any, Any]:
    """Yield one trap to the driver; evaluate to the value the G is handed when resumed."""
    return (yield what)


class _State(threading.local):
    """Per OS thread: the runtime whose driver is stepping goroutines on this thread.

    Invariant: ``rt`` is not None exactly while a driver on this thread is inside its
    stepping loop (None while it awaits trio). Thread-local so that runtimes in several
    threads (each its own trio.run) never see each other's scheduler. The C accelerator
    keeps the same slot in C thread-local storage, where its channel code reads it.
    """

    rt: Runtime | None = None


def _no_budget_to_refill() -> None:
    """Until the pure-Python channels register their refill (``gosim._chan``)."""


def set_op_budget_refill(refill: Callable[[], None]) -> None:
    """Install the pure-Python channels' budget refill (the C twin's is built in)."""
    global _op_budget_refill
    _op_budget_refill = refill


def refill_op_budget() -> None:
    """Refill the op budget to ``OP_BUDGET``; called once as each runtime starts."""
    _op_budget_refill()


def current_runtime() -> Runtime:
    """The runtime running the calling goroutine; :class:`NotInRuntime` outside one."""
    rt = _state.rt
    if rt is None:
        raise NotInRuntime("not inside a gosim goroutine")
    return rt


# The one place this module chooses C or Python. The C twins: the thread-local slot
# (kept in C thread-local storage, where the C channel code reads it), the trap (an
# awaitable object instead of a generator: no frame per trap), the op budget's refill
# and current_runtime (the same read of the same slot, in one C call). The channel and
# select fast paths' op budget is one countdown per process, not per runtime (see
# gosim._chan), so the driver refills it when a runtime starts: what an earlier runtime
# left of it must not move where a seeded run checks for preemption.
_state: _State
_trap: Callable[[Any], Awaitable[Any]]
_op_budget_refill: Callable[[], None]
if speedups is None:
    _state = _State()
    _trap = _trap_py
    _op_budget_refill = _no_budget_to_refill
else:
    _state = speedups.State()
    _trap = speedups.trap
    speedups.configure(
        park=PARK,
        preempt=PREEMPT,
        send_on_closed=_exceptions.SendOnClosedChannel,
        close_of_closed=_exceptions.CloseOfClosedChannel,
        not_in_runtime=NotInRuntime,
        wait_recv=_g.WAIT_CHAN_RECEIVE,
        wait_send=_g.WAIT_CHAN_SEND,
        op_budget=OP_BUDGET,
        g_class=G,
        runq_size=RUNQ_SIZE,
        gfree_local_max=GFREE_LOCAL_MAX,
        periodic_mask=PERIODIC_MASK,
        transitions=_g.TRANSITIONS,
        internal_error=_exceptions.RuntimeInternalError,
        debug=_g.DEBUG,
    )
    _op_budget_refill = speedups.reset_budget
    current_runtime = speedups.current_runtime


class _CallBox:
    """Where a goroutine started by ``run`` or ``rt.call`` leaves its outcome.

    The goroutine runs the caller's coroutine itself (no wrapper frame on every
    resume); the driver delivers the return value or exception here on exit.
    """

    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.result: outcome.Outcome[Any] | None = None
        self.done = trio.Event()

    def deliver(self, result: outcome.Outcome[Any]) -> None:
        self.result = result
        self.done.set()
