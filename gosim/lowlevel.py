"""Scheduler hooks for code that builds new primitives on gosim (not for daily use).

This module is the one door from the layers above (channels, select, time, sync, net,
context, user extensions) into ``gosim._core``: nothing outside the core imports the
core's modules except through here and ``gosim._core._exceptions``
(``tests/gosim/test_layering.py`` checks it). ``sync`` parks goroutines on its
:class:`ParkingLot` and the netpoller through :func:`park` and :func:`ready`, as trio's
own ``Lock`` waits through ``trio.lowlevel``. The contract of those two:

* :func:`park` may only be awaited by a goroutine, after it has recorded itself
  (:func:`current_g`) somewhere a waker will find it. It returns the value passed to
  :func:`ready`.
* :func:`ready` must be called exactly once per park, from a goroutine or a timer of
  the same runtime; the G then runs soon on the caller's P (``runnext``).

Most waits need neither by hand: a :class:`Waiter` is one outcome settled once (by a
goroutine, a timer or a callback on the driver), awaited by one goroutine or handed to
one callback, with an optional deadline that is a runtime timer, and it leaves every
queue when its goroutine leaves by an exception; a :class:`ParkingLot` is a FIFO of
them (trio's). Every park names a :class:`WaitReason` (Go's ``waitReason``), which
deadlock dumps print. ``gosim._core._wait`` has the guarantees in full.

This door hands out functions and the waiting primitives only (``Waiter``,
``ParkingLot``, ``WaitReason``, ``RuntimeVar``, ``RuntimeTimer``, ``ThreadWake``, the
``NetPoller`` protocol), as ``trio.lowlevel`` hands out functions and ``ParkingLot``, never its
Runner: whatever is built above the scheduler (netframe, idempotency, user code) is
built on these. A layer keeps per-runtime state in a :class:`RuntimeVar` (trio's
``RunVar``): the heap and the simulated network do. :func:`set_chooser` lets a
deterministic run's scheduling decisions be made from outside Go's order (schedule
exploration, ``gosim.testing``). The runtime's records and traps (the running
runtime's fields, ``G``, ``Sudog``, the driver's traps, the C accelerator) are for
gosim's own packages alone, which implement the runtime's mechanisms and cannot afford a
function call per channel operation: they take them from ``gosim._internals``, which
nothing outside gosim may import (``tests/gosim/test_layering.py`` checks both).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from gosim._core._dump import goroutine_dump as goroutine_dump
from gosim._core._dump import panic_report as panic_report
from gosim._core._exceptions import NotInRuntime
from gosim._core._exceptions import WaitCancelled as WaitCancelled
from gosim._core._exceptions import WaitTimeout as WaitTimeout
from gosim._core._g import WAIT_CHAN_RECEIVE as WAIT_CHAN_RECEIVE
from gosim._core._g import WAIT_CHAN_SEND as WAIT_CHAN_SEND
from gosim._core._g import WAIT_SELECT as WAIT_SELECT
from gosim._core._g import WAIT_SELECT_NO_CASES as WAIT_SELECT_NO_CASES
from gosim._core._g import WAIT_SLEEP as WAIT_SLEEP
from gosim._core._g import WaitReason as WaitReason
from gosim._core._netpoll import NetPoller as NetPoller

# The goroutine-facing runtime API, which ``gosim`` re-exports (listed here so that the
# package, too, reaches the core through this one door).
from gosim._core._runtime import RuntimeVar as RuntimeVar
from gosim._core._runtime import go as go
from gosim._core._runtime import goexit as goexit
from gosim._core._runtime import goid as goid
from gosim._core._runtime import gomaxprocs as gomaxprocs
from gosim._core._runtime import gosched as gosched
from gosim._core._runtime import num_goroutine as num_goroutine
from gosim._core._runtime import open_runtime as open_runtime
from gosim._core._runtime import panic as panic
from gosim._core._runtime import preempt_point as preempt_point
from gosim._core._runtime import run as run
from gosim._core._runtime import schedtrace as schedtrace
from gosim._core._runtime import statistics as statistics
from gosim._core._signal import signal_number as signal_number
from gosim._core._state import PARK as _PARK
from gosim._core._state import _state, _trap
from gosim._core._state import current_runtime as current_runtime
from gosim._core._syscall import ThreadWake as ThreadWake
from gosim._core._syscall import syscall as syscall
from gosim._core._syscall import trio_call as trio_call
from gosim._core._timers import Timer as RuntimeTimer
from gosim._core._wait import ParkingLot as ParkingLot
from gosim._core._wait import ParkingLotStatistics as ParkingLotStatistics
from gosim._core._wait import Waiter as Waiter

if TYPE_CHECKING:
    from gosim._core._g import G


def current_g() -> G:
    """The calling goroutine's record."""
    rt = _state.rt
    if rt is None or rt.curg is None:
        raise NotInRuntime("not inside a gosim goroutine")
    return rt.curg


def park(waitreason: WaitReason) -> Awaitable[Any]:
    """Park the calling goroutine with Go's wait reason until :func:`ready` is called for it.

    Returns the trap itself to await (no coroutine frame of its own).
    """
    current_g().waitreason = waitreason
    return _trap(_PARK)


def ready(g: G, value: Any = None) -> None:
    """Make a parked goroutine runnable; its :func:`park` returns ``value``."""
    rt = _state.rt
    if rt is None:
        raise NotInRuntime("ready: not inside a gosim runtime")
    rt.goready(g, value)


def can_spin(iteration: int) -> bool:
    """Whether a lock's ``iteration``-th spin can pay off (Go's ``sync_runtime_canSpin``)."""
    return current_runtime().can_spin(iteration)


def netpoller() -> NetPoller | None:
    """The running runtime's netpoller, or None before a network layer installed one."""
    return current_runtime().netpoller


def set_netpoller(poller: NetPoller) -> None:
    """Install the running runtime's netpoller (see ``gosim._core._netpoll``); once."""
    rt = current_runtime()
    if rt.netpoller is not None and rt.netpoller is not poller:
        raise RuntimeError("set_netpoller: this runtime already has a netpoller")
    rt.netpoller = poller


def reproducible() -> bool:
    """Whether the running runtime must not wait on an OS thread's timing: seeded (its
    :func:`syscall` runs inline on the driver, for a reproducible schedule) or on a
    virtual clock (which jumps ahead while the driver waits for I/O). A layer that hands
    work to a thread of its own and is woken by it (a :class:`ThreadWake`) uses
    :func:`syscall` instead while this is True."""
    return current_runtime().deterministic or virtual_clock()


def virtual_clock() -> bool:
    """Whether the running runtime's clock is virtual (``virtual_time=True``, or trio's
    ``MockClock``): it moves only by jumps, when nothing can run (a syscall in flight
    holds it), so it says nothing of how long a real peer takes to answer."""
    current_runtime()  # raises NotInRuntime
    # trio's MockClock (virtual_time) is the clock with an autojump.
    return hasattr(trio.lowlevel.current_clock(), "autojump_threshold")


async def set_chooser(chooser: Callable[[list[int]], int] | None) -> None:
    """Let ``chooser`` decide which runnable goroutine runs next in the running
    runtime, which must be deterministic (``gosim.run(..., seed=N)``); None gives the
    decisions back to Go's order. The caller then yields as :func:`gosched` does, which
    ends the driver's burst: every later switch is the chooser's.

    At every switch where the P whose turn it is could take two or more goroutines (its
    ``runnext``, its local queue, the global queue), the driver calls ``chooser`` with
    their goids in the order it would take them itself and runs the one at the index
    returned, which must be in range (else the run stops with ``ValueError``). Index 0
    is always the default decision, so a chooser that returns 0 changes nothing but
    the length of the driver's bursts (one switch each). Decisions come at the points
    where a goroutine parks, yields (``gosched``, a preemption), ends, or enters a
    syscall; a channel operation that completes at once is no decision. The driver
    takes its pure-Python inner loop while a chooser is set, as it does for a trace;
    the C accelerator's ``go``, ``goready`` and channel operations are unchanged.
    ``gosim.testing`` explores schedules through this hook.
    """
    rt = current_runtime()
    if chooser is not None and not rt.deterministic:
        raise RuntimeError(
            "set_chooser: the runtime is not deterministic (run it with gosim.run(..., seed=N))"
        )
    rt.chooser = chooser
    await gosched()


def add_timer(t: RuntimeTimer, when: float) -> None:
    """Arm a runtime timer on the current P; ``t.f(t.arg, now)`` runs on the driver when due."""
    rt = _state.rt  # current_runtime() inline: deadlines arm a timer per request
    if rt is None:
        raise NotInRuntime("not inside a gosim goroutine")
    rt.timers.add(t, when)


def del_timer(t: RuntimeTimer) -> bool:
    """Disarm a runtime timer; True when it was armed."""
    rt = _state.rt
    if rt is None:
        raise NotInRuntime("not inside a gosim goroutine")
    return rt.timers.delete(t)


__all__ = [
    "WAIT_CHAN_RECEIVE",
    "WAIT_CHAN_SEND",
    "WAIT_SELECT",
    "WAIT_SELECT_NO_CASES",
    "WAIT_SLEEP",
    "NetPoller",
    "ParkingLot",
    "ParkingLotStatistics",
    "RuntimeTimer",
    "RuntimeVar",
    "ThreadWake",
    "WaitCancelled",
    "WaitReason",
    "WaitTimeout",
    "Waiter",
    "add_timer",
    "can_spin",
    "current_g",
    "current_runtime",
    "del_timer",
    "go",
    "goexit",
    "goid",
    "gomaxprocs",
    "goroutine_dump",
    "gosched",
    "netpoller",
    "num_goroutine",
    "open_runtime",
    "panic",
    "panic_report",
    "park",
    "preempt_point",
    "ready",
    "reproducible",
    "run",
    "schedtrace",
    "set_chooser",
    "set_netpoller",
    "signal_number",
    "statistics",
    "syscall",
    "trio_call",
    "virtual_clock",
]
