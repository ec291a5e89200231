"""Scheduler hooks for code that builds new primitives on gosim (not for daily use).

``sync``, ``net`` and user extensions park and ready goroutines through these, as
trio's own ``Lock`` uses ``trio.lowlevel``. The contract:

* :func:`park` may only be awaited by a goroutine, after it has recorded itself
  (:func:`current_g`) somewhere a waker will find it. It returns the value passed to
  :func:`ready`.
* :func:`ready` must be called exactly once per park, from a goroutine or a timer of
  the same runtime; the G then runs soon on the caller's P (``runnext``).
"""

from __future__ import annotations

from typing import Any

from gosim._core import _sched
from gosim._core._exceptions import NotInRuntime
from gosim._core._g import G as G
from gosim._core._netpoll import NetPoller as NetPoller
from gosim._core._sched import Runtime as Runtime
from gosim._core._sched import current_runtime as current_runtime
from gosim._core._sched import preempt_point as preempt_point
from gosim._core._timers import Timer as RuntimeTimer


def current_g() -> G:
    """The calling goroutine's record."""
    rt = _sched._state.rt
    if rt is None or rt.curg is None:
        raise NotInRuntime("not inside a gosim goroutine")
    return rt.curg


async def park(waitreason: str) -> Any:
    """Park the calling goroutine with Go's wait reason until :func:`ready` is called for it."""
    g = current_g()
    g.waitreason = waitreason
    return await _sched._trap(_sched.PARK)


def ready(g: G, value: Any = None) -> None:
    """Make a parked goroutine runnable; its :func:`park` returns ``value``."""
    rt = _sched._state.rt
    if rt is None:
        raise NotInRuntime("ready: not inside a gosim runtime")
    rt.goready(g, value)


def netpoller() -> NetPoller | None:
    """The running runtime's netpoller, or None before a network layer installed one."""
    return current_runtime().netpoller


def set_netpoller(poller: NetPoller) -> None:
    """Install the running runtime's netpoller (see ``gosim._core._netpoll``); once."""
    rt = current_runtime()
    if rt.netpoller is not None and rt.netpoller is not poller:
        raise RuntimeError("set_netpoller: this runtime already has a netpoller")
    rt.netpoller = poller


def add_timer(t: RuntimeTimer, when: float) -> None:
    """Arm a runtime timer on the current P; ``t.f(t.arg, now)`` runs on the driver when due."""
    current_runtime().addtimer(t, when)


def del_timer(t: RuntimeTimer) -> bool:
    """Disarm a runtime timer; True when it was armed."""
    return current_runtime().deltimer(t)


__all__ = [
    "G",
    "NetPoller",
    "Runtime",
    "RuntimeTimer",
    "add_timer",
    "current_g",
    "current_runtime",
    "del_timer",
    "netpoller",
    "park",
    "preempt_point",
    "ready",
    "set_netpoller",
]
