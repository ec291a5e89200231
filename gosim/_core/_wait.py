"""The one way to wait: a settle-once :class:`Waiter` and a :class:`ParkingLot` of them.

Glossary
--------
Waiter
    One outcome that comes later: a value (:meth:`~Waiter.settle`) or an error
    (:meth:`~Waiter.fail`), decided once. Its consumer is either one goroutine parked
    in :meth:`~Waiter.wait` (with a :class:`~gosim._core._g.WaitReason` its dump shows)
    or one callback (:meth:`~Waiter.on_settle`) that runs at the settle, so that work
    finishing elsewhere needs no goroutine waiting for it. An optional deadline
    (:meth:`~Waiter.set_deadline`) is a runtime timer that settles it when due. Go's
    ``sudog`` plays this part for Go's channels and semaphores; trio's tasks wait on
    ``wait_task_rescheduled`` with an abort function, which is what leaving a wait by
    an exception does here.
ParkingLot
    A FIFO of pending waiters (trio's ``ParkingLot``, on which all of trio's waits are
    built): :meth:`~ParkingLot.park` queues a new waiter for the calling goroutine and
    waits on it; :meth:`~ParkingLot.unpark` settles the head. ``gosim.sync`` builds its
    Mutex, RWMutex, WaitGroup, Once, Cond and Semaphore on it.

The guarantees
--------------
* **Settled once.** The first of ``settle``, ``fail``, ``cancel`` or the deadline decides
  the outcome and returns True; every later one changes nothing and returns False. A
  race between a reply, a lost connection and a deadline is therefore safe to write as
  three settles, and the loser learns it lost.
* **One consumer.** At most one goroutine waits on a waiter, or one callback is set
  (RuntimeError otherwise). A settle that comes before the wait is kept: the wait
  returns (or raises) at once without parking.
* **Leaving cleans up.** When a wait ends by an exception instead of a settle (the
  goroutine's coroutine closed at shutdown, an error thrown in), the waiter is cancelled
  (its outcome becomes :class:`WaitCancelled`): it leaves its parking lot, its timer is
  disarmed, and a later settle wakes nobody. A settle, by anyone, likewise takes the
  waiter out of its lot and disarms its timer. Invariant: a waiter is in a lot only
  while pending, so ``unpark`` never hands anything (a lock, a permit) to a goroutine
  that has gone.
* **Who may settle.** Any code on the runtime's thread: a goroutine, a timer or netpoller
  callback on the driver (which has no goroutine of its own), or a trio task of the
  runtime's trio run (the goroutine is then handed to the driver as a syscall's is). A
  settle never blocks and never yields; the woken goroutine runs soon on the settling
  P (``runnext``), as after Go's ``goready``. Another OS thread hands the settle to
  the runtime's thread through a ``ThreadWake`` (``gosim._core._syscall``), made
  before it waits. As in Go, the runtime reports a deadlock when every goroutine
  waits and nothing it knows of (a timer, I/O, a syscall or trio call in flight, a
  ThreadWake outstanding) can wake one: a waiter that only an outside party will
  settle needs such a source for as long as it waits.

:meth:`Waiter.reset` makes a settled waiter pending again, keeping its timer, so a
goroutine that waits again and again (a connection's heartbeat) allocates nothing per
wait.
"""

from __future__ import annotations

import math
import types
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Self

from gosim._core._accel import speedups
from gosim._core._exceptions import NotInRuntime, WaitCancelled, WaitTimeout
from gosim._core._g import G, WaitReason
from gosim._core._state import PARK
from gosim._core._state import _state as _tls
from gosim._core._timers import Timer

__all__ = ["ParkingLot", "ParkingLotStatistics", "Waiter"]

# Waiter._state: pending, settled with a value, settled with an error.
_PENDING: Final = 0
_VALUE: Final = 1
_ERROR: Final = 2


class _Timeout:
    """The default ``expired`` of :meth:`Waiter.set_deadline`: fail with WaitTimeout."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TIMEOUT"


TIMEOUT: Final = _Timeout()

_WAITER: Final = WaitReason.WAITER
_CANCELLED: Final = "the wait was withdrawn before it was settled"  # C: waitop_leave


if TYPE_CHECKING or speedups is None:

    class _WaiterBase:
        """A Waiter's fields and hot methods (the C accelerator's ``WaiterBase`` has the same)."""

        __slots__ = ("_callback", "_g", "_lot", "_rt", "_state", "_timer", "_value", "data")

        def __init__(self, data: Any = None) -> None:
            self.data = data
            self._state = _PENDING
            self._value: Any = None  # the value, or the error when _state is _ERROR
            # The consumer: the parked goroutine, or (fn, arg) to call at the settle.
            self._g: G | None = None
            self._callback: tuple[Callable[[Any, Any], None], Any] | None = None
            self._lot: deque[Any] | None = None  # Invariant: set only while pending and queued
            self._timer: Timer | None = None  # the deadline's, made at the first one
            self._rt: Any = None  # the runtime of the wait or the deadline

        # ------------------------------------------------------------- settling

        def on_settle(self, fn: Callable[[Any, Self], None], arg: Any = None) -> None:
            """Call ``fn(arg, waiter)`` at the settle (at once if it is settled): a consumer
            that is no goroutine. ``fn`` runs where the settle runs; it must not block, and
            what it raises goes to the settler. One consumer, as for :meth:`wait`."""
            if self._state:
                fn(arg, self)
                return
            if self._g is not None or self._callback is not None:
                raise RuntimeError("a Waiter has one consumer: it has one already")
            self._callback = (fn, arg)

        def done(self) -> bool:
            """Whether the outcome is decided."""
            return self._state != _PENDING

        def result(self) -> Any:
            """The decided value, or raise the decided error; RuntimeError while pending."""
            if self._state == _VALUE:
                return self._value
            if self._state == _ERROR:
                raise self._value
            raise RuntimeError("the Waiter is not settled yet")

        def settle(self, value: Any = None) -> bool:
            """Decide the outcome: ``value``. True if this call decided it, False (and
            nothing changes) if it was decided already."""
            if self._state:
                return False
            self._decide(_VALUE, value)
            return True

        def fail(self, exc: BaseException) -> bool:
            """Decide the outcome: ``exc``, raised by the wait. As :meth:`settle` otherwise."""
            if self._state:
                return False
            self._decide(_ERROR, exc)
            return True

        def _decide(self, state: int, value: Any) -> None:
            self._state = state
            self._value = value
            lot = self._lot
            if lot is not None:  # settled by someone other than the lot's unpark
                self._lot = None
                lot.remove(self)
            t = self._timer
            if t is not None:
                if t.armed:
                    self._rt.timers.delete(t)
                # Its (waiter, expired, recheck) refers back to the waiter: dropped, so
                # a settled waiter is freed by its last reference, not by the collector.
                t.arg = None
            g = self._g
            if g is not None:
                self._g = None
                rt = _tls.rt
                if rt is self._rt:
                    rt.goready(g, None)
                else:  # from a trio task of the runtime's run: hand it to the driver
                    self._rt.inject(g, None)
                return
            cb = self._callback
            if cb is not None:
                self._callback = None
                cb[0](cb[1], self)

        # ------------------------------------------------------------- deadline

        def set_deadline(
            self,
            when: float,
            expired: Any = TIMEOUT,
            recheck: Callable[[], float] | None = None,
        ) -> None:
            """Arm a runtime timer at runtime-clock time ``when`` (``math.inf``: disarm it).

            When it fires the waiter fails with :class:`WaitTimeout`, or with ``expired``
            given, is settled with that value instead (a sleep's end is no error). With
            ``recheck``, the firing timer first asks it for the deadline again and re-arms
            itself for a later one instead of settling (a heartbeat whose peer was heard
            meanwhile costs no goroutine switch); ``recheck`` runs on the driver and must
            neither wait nor fail. Re-arming moves the one timer. On a settled waiter this
            does nothing. Called inside the runtime (a goroutine, or a callback on its driver).
            """
            if self._state:
                return
            rt = _tls.rt
            if rt is None:
                raise NotInRuntime("Waiter.set_deadline: not inside a gosim runtime")
            self._rt = rt
            t = self._timer
            if when == math.inf:
                if t is not None and t.armed:
                    rt.timers.delete(t)
                return
            if t is None:
                t = self._timer = Timer(_expire, (self, expired, recheck))
            else:
                t.arg = (self, expired, recheck)
            rt.timers.add(t, when)

        # ------------------------------------------------------------- consuming

        @types.coroutine
        def wait(self, reason: WaitReason = _WAITER) -> Generator[Any, Any, Any]:
            """Park the calling goroutine (wait reason ``reason``) until the outcome is
            decided; return the value or raise the error. Returns at once when it is
            decided already. Only one goroutine may wait at a time, and not on a waiter
            with a callback (RuntimeError). An exception that ends the park instead cancels
            the waiter (see the module docstring) and goes on."""
            if self._state == _PENDING:
                rt = _tls.rt
                g = rt.curg if rt is not None else None
                if g is None:
                    raise NotInRuntime("Waiter.wait: not inside a gosim goroutine")
                if self._g is not None or self._callback is not None:
                    raise RuntimeError("a Waiter has one consumer: a goroutine waits on it already")
                self._g = g
                self._rt = rt
                g.waitreason = reason
                try:
                    yield PARK
                except BaseException:
                    if self._g is g:  # left without a settle: leave every queue
                        self._g = None
                        if not self._state:
                            self._decide(_ERROR, WaitCancelled(_CANCELLED))
                    raise
            if self._state == _ERROR:
                raise self._value
            return self._value

else:
    _WaiterBase = speedups.WaiterBase


class Waiter(_WaiterBase):
    """One outcome, settled once, awaited by at most one goroutine; see the module docstring.

    ``Waiter(data=None)``: ``data`` is the waker's to read (a lock's waiter keeps when it
    started waiting, a semaphore's how many units it wants), as Go's ``sudog`` carries
    ``elem``. ``settle``, ``fail``, ``set_deadline`` and ``wait`` are ``_WaiterBase``'s
    (in C where the accelerator is built), and so are ``on_settle``, ``done`` and
    ``result``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        state = ("pending", "settled", "failed")[self._state]
        return f"<gosim.lowlevel.Waiter {state}{' parked' if self._g is not None else ''}>"

    def cancel(self) -> bool:
        """Withdraw: fail with :class:`WaitCancelled` (out of its lot, timer disarmed).

        True when it was still pending: for a waiter queued for a grant (a semaphore's
        units), False means the grant came first and is the caller's to give back.
        """
        return self.fail(WaitCancelled(_CANCELLED))

    def reset(self) -> None:
        """Make the waiter pending again for another wait, keeping its timer object
        (disarmed). RuntimeError while a goroutine waits on it or it is queued in a lot."""
        if self._g is not None or self._lot is not None:
            raise RuntimeError("Waiter.reset: it is being waited on")
        t = self._timer
        if t is not None and t.armed:
            self._rt.timers.delete(t)
        self._state = _PENDING
        self._value = None
        self._callback = None


def _expire(arg: tuple[Waiter, Any, Callable[[], float] | None], now: float) -> None:
    """A waiter's deadline timer fired (on the driver). The pure path's; the C
    ``set_deadline`` arms its twin, ``gosim._speedups._expire``."""
    w, expired, recheck = arg
    if w._state:
        return
    if recheck is not None:
        when = recheck()
        if when > now:  # the deadline moved on meanwhile: wait on
            if when != math.inf:
                w._rt.timers.add(w._timer, when)
            return
    if expired is TIMEOUT:
        w._decide(_ERROR, WaitTimeout("the wait's deadline passed"))
    else:
        w._decide(_VALUE, expired)


@dataclass(frozen=True)
class ParkingLotStatistics:
    """A snapshot of a :class:`ParkingLot` (trio's ``statistics()``): ``waiters`` queued."""

    waiters: int


if TYPE_CHECKING or speedups is None:

    class _ParkingLotBase(deque[Waiter]):
        """A ParkingLot's hot methods (the C accelerator's ``ParkingLotBase`` has the same)."""

        __slots__ = ()

        def park(self, reason: WaitReason, data: Any = None, front: bool = False) -> Awaitable[Any]:
            """Queue a new waiter (``data`` on it) for the calling goroutine, at the tail or
            with ``front`` at the head, and wait on it (wait reason ``reason``): the value
            :meth:`unpark` gives, or the error a :meth:`Waiter.fail` gives."""
            w = Waiter(data)
            w._lot = self
            if front:
                self.appendleft(w)
            else:
                self.append(w)
            return w.wait(reason)

        def unpark(self, value: Any = None) -> Waiter | None:
            """Settle the head waiter with ``value`` (its goroutine runs next); return it, or
            None when the lot is empty."""
            if not self:
                return None
            w = self.popleft()
            w._lot = None
            w._decide(_VALUE, value)
            return w

        def unpark_all(self, value: Any = None) -> int:
            """Settle every queued waiter with ``value``, in order; how many there were."""
            n = len(self)
            while self:
                w = self.popleft()
                w._lot = None
                w._decide(_VALUE, value)
            return n

else:
    _ParkingLotBase = speedups.ParkingLotBase


class ParkingLot(_ParkingLotBase):
    """A fair (FIFO) queue of pending waiters; see the module docstring.

    ``len(lot)`` is the number queued, ``bool(lot)`` whether any is, and iterating
    gives them in queue order. It is a ``deque`` of its waiters so that those two, which
    every uncontended lock and unlock asks, cost no Python call; change it only through
    these methods. ``park``, ``unpark`` and ``unpark_all`` are ``_ParkingLotBase``'s (in
    C where the accelerator is built). Entries leave by :meth:`unpark`, :meth:`repark`
    or by being settled or cancelled elsewhere (a deadline, a goroutine leaving its wait
    by an exception).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<gosim.lowlevel.ParkingLot waiters={len(self)}>"

    def add(self, w: Waiter, front: bool = False) -> None:
        """Queue an existing pending waiter (one with a callback, say) as :meth:`park` does."""
        if w._state or w._lot is not None:
            raise RuntimeError("ParkingLot.add: the waiter is settled or queued already")
        w._lot = self
        if front:
            self.appendleft(w)
        else:
            self.append(w)

    def peek(self) -> Waiter | None:
        """The head waiter (the next :meth:`unpark` settles it), or None."""
        return self[0] if self else None

    def repark(self, new_lot: ParkingLot, count: int = 1) -> int:
        """Move the first ``count`` waiters to the tail of ``new_lot``, in order, still
        pending (trio's ``repark``); how many moved."""
        if new_lot is self:
            return min(count, len(self))
        moved = 0
        while self and moved < count:
            w = self.popleft()
            w._lot = new_lot
            new_lot.append(w)
            moved += 1
        return moved

    def repark_all(self, new_lot: ParkingLot) -> int:
        """Move every waiter to ``new_lot``; how many moved."""
        return self.repark(new_lot, len(self))

    def statistics(self) -> ParkingLotStatistics:
        """A snapshot: how many waiters are queued now."""
        return ParkingLotStatistics(waiters=len(self))


if speedups is not None:
    speedups.configure_wait(Waiter, WaitCancelled, _WAITER, Timer, TIMEOUT, WaitTimeout)
