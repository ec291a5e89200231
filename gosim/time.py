"""Go's ``time`` package on the gosim scheduler: sleep, timers, tickers, the clock.

Durations are float seconds (``Millisecond`` and friends are provided). Timers live in
per-P heaps on trio's clock (``gosim._core._timers``); under ``virtual_time=True`` that
clock is trio's ``MockClock`` with autojump, so hours of sleeping take no real time.
It jumps whenever nothing can run, except while a syscall runs on a thread (Go's
``testing/synctest`` does not count such a goroutine as durably blocked); a goroutine
waiting on a real socket does not hold it, so a program under virtual time talks over
the ``"sim"`` network of :mod:`gosim.net`, whose waits are virtual too.

Timer channels follow Go 1.23: they behave as unbuffered (``len`` and ``cap`` are 0), and
once ``stop`` or ``reset`` returns no value from before the call is received. ``stop``
and ``reset`` return True when the timer was still pending, which includes a value that
had fired but not yet been received. As in Go 1.23, a timer channel that no goroutine
is waiting to receive from keeps no deadlocked program alive: with every goroutine
blocked and only such timers pending, the runtime reports the deadlock at once.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Final

from gosim import _internals
from gosim._chan import Chan
from gosim._core._exceptions import NotInRuntime
from gosim.lowlevel import WAIT_SLEEP, Waiter, current_runtime
from gosim.lowlevel import RuntimeTimer as _RTimer

__all__ = [
    "FuncTimer",
    "Hour",
    "Microsecond",
    "Millisecond",
    "Minute",
    "Nanosecond",
    "Second",
    "Ticker",
    "Timer",
    "after",
    "after_func",
    "now",
    "since",
    "sleep",
    "tick",
]

Nanosecond: Final = 1e-9
Microsecond: Final = 1e-6
Millisecond: Final = 1e-3
Second: Final = 1.0
Minute: Final = 60.0
Hour: Final = 3600.0


def now() -> float:
    """The runtime clock in seconds (monotonic; virtual under ``virtual_time=True``)."""
    rt = _internals.state.rt  # current_runtime() inline: a frame less on a hot read
    if rt is None:
        raise NotInRuntime("not inside a gosim goroutine")
    return rt.now()


def since(t: float) -> float:
    """Seconds elapsed since ``t`` (a value from :func:`now`)."""
    return now() - t


async def sleep(d: float) -> None:
    """Park the calling goroutine for at least ``d`` seconds; ``d <= 0`` returns at once.

    A :class:`gosim.lowlevel.Waiter` whose deadline settles it (wait reason ``sleep``):
    a sleep left by an exception (its coroutine closed) disarms its timer with it.
    """
    rt = current_runtime()
    if d <= 0:
        return
    if rt.curg is None:
        raise NotInRuntime("sleep: not inside a gosim goroutine")
    w = Waiter()
    w.set_deadline(rt.now() + d, None)
    await w.wait(WAIT_SLEEP)


class _TimerChan(Chan[float]):
    """A timer's channel: one slot inside, but reports ``len`` and ``cap`` 0 (Go 1.23)."""

    __slots__ = ()

    def len(self) -> int:
        return 0

    def cap(self) -> int:
        return 0

    def __len__(self) -> int:
        return 0


def _send_time(c: _TimerChan, now: float) -> None:
    c.try_send(now)


class Timer:
    """Go's ``time.Timer``: after ``d`` seconds the current time is sent on :attr:`c`."""

    __slots__ = ("_rt", "_t", "c")

    def __init__(self, d: float) -> None:
        rt = current_runtime()
        self._rt = rt
        self.c: Chan[float] = _TimerChan(1)
        self._t = _RTimer(_send_time, self.c, chan=self.c)
        rt.timers.add(self._t, rt.now() + max(d, 0.0))

    def _drain(self) -> bool:
        return self.c._clear_buf() > 0

    def stop(self) -> bool:
        """Stop the timer; True if it was pending (a fired, unreceived value counts)."""
        active = self._rt.timers.delete(self._t)
        return self._drain() or active

    def reset(self, d: float) -> bool:
        """Re-arm for ``d`` seconds from now; True if the timer was pending before."""
        pending = self.stop()
        self._rt.timers.add(self._t, self._rt.now() + max(d, 0.0))
        return pending


class Ticker:
    """Go's ``time.Ticker``: the time is sent on :attr:`c` every ``d`` seconds.

    A slow receiver misses ticks rather than queueing them (one slot), as in Go.
    """

    __slots__ = ("_rt", "_t", "c")

    def __init__(self, d: float) -> None:
        if d <= 0:
            raise ValueError("non-positive interval for NewTicker")
        rt = current_runtime()
        self._rt = rt
        self.c: Chan[float] = _TimerChan(1)
        self._t = _RTimer(_send_time, self.c, period=d, chan=self.c)
        rt.timers.add(self._t, rt.now() + d)

    def stop(self) -> None:
        """Stop ticking; no tick from before the call is received afterwards."""
        self._rt.timers.delete(self._t)
        self.c._clear_buf()

    def reset(self, d: float) -> None:
        """Tick every ``d`` seconds from now on."""
        if d <= 0:
            raise ValueError("non-positive interval for Ticker.Reset")
        self.stop()
        self._t.period = d
        self._rt.timers.add(self._t, self._rt.now() + d)


def after(d: float) -> Chan[float]:
    """A channel that receives the time once, ``d`` seconds from now (Go's ``time.After``)."""
    return Timer(d).c


def tick(d: float) -> Chan[float] | None:
    """A ticker's channel, or None for ``d <= 0`` (Go's ``time.Tick``)."""
    if d <= 0:
        return None
    return Ticker(d).c


def _start_func(
    arg: tuple[Callable[..., Coroutine[Any, Any, Any]], tuple[Any, ...]], now: float
) -> None:
    rt = _internals.state.rt
    assert rt is not None
    rt.newproc(arg[0], arg[1], 0)


class FuncTimer:
    """The timer :func:`after_func` returns: ``stop`` prevents the call if it has not started."""

    __slots__ = ("_rt", "_t")

    def __init__(
        self, d: float, fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...]
    ) -> None:
        rt = current_runtime()
        self._rt = rt
        self._t = _RTimer(_start_func, (fn, args))
        rt.timers.add(self._t, rt.now() + max(d, 0.0))

    def stop(self) -> bool:
        """True when this stopped the call; False when it already started or was stopped."""
        return self._rt.timers.delete(self._t)

    def reset(self, d: float) -> bool:
        """Re-arm to start the call ``d`` seconds from now; True if it was still pending."""
        pending = self._rt.timers.delete(self._t)
        self._rt.timers.add(self._t, self._rt.now() + max(d, 0.0))
        return pending


def after_func(d: float, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> FuncTimer:
    """Start ``fn(*args)`` in its own goroutine after ``d`` seconds (Go's ``time.AfterFunc``)."""
    return FuncTimer(d, fn, args)
