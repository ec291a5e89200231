"""Runtime timers, the per-P timer heap and the runtime's timers (Go's ``time.go``).

A :class:`Timer` is armed at most once at a time on one P's :class:`TimerHeap`. When it
expires the driver calls ``timer.fire(now)`` on that P: sleeping goroutines are readied,
timer channels get a non-blocking send, ``after_func`` starts a goroutine. Periodic
timers (tickers) are re-armed one period after the last tick they covered.

Stopping or re-arming does not search the heap: the heap entry carries the sequence
number it was pushed with and an entry whose number no longer matches its timer's is
stale and skipped when it reaches the top (Go's ``timerModifiedLater`` / ``timerDeleted``
idea). The heap is rebuilt when stale entries outnumber live ones, so a timer reset
millions of times (an idle timeout, say) cannot grow it without bound.

A runtime holds one :class:`Timers` (``rt.timers``): the count of armed timers over all
its Ps (a wake source for the driver) and the sequence numbers, and the ways to arm,
disarm and run them. Its ``add``/``delete`` are in C where the accelerator is built
(``TimersBase`` in ``gosim/_speedups_sched.c.h``); ``_add_py``/``_delete_py`` are the
reference and the pure path.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gosim._core._accel import speedups

if TYPE_CHECKING:
    from gosim._core._runq import P
    from gosim._core._runtime import Runtime

if TYPE_CHECKING or speedups is None:

    class _TimerFields:
        """A runtime timer's fields (the C accelerator's ``TimerBase`` has the same)."""

        __slots__ = ("arg", "armed", "chan", "f", "p", "period", "seq", "when")

        def __init__(
            self,
            f: Callable[[Any, float], None],
            arg: Any,
            period: float = 0.0,
            chan: Any = None,
        ) -> None:
            self.f = f
            self.arg = arg
            self.period = period
            # A channel timer's channel (Timer, Ticker, after): firing only offers a
            # value on it, so the timer can wake a goroutine only while one waits to
            # receive. Go 1.23 keeps such a timer out of the heap until then, which is
            # what lets it report a deadlock that an unreceived ticker would otherwise
            # hide.
            self.chan = chan
            self.when = 0.0
            self.p: Any = None  # the P whose heap holds the timer
            self.armed = False  # Invariant: armed iff a live heap entry carries self.seq
            self.seq = 0

    class _TimerHeapFields:
        """A timer heap's fields (the C accelerator's ``TimerHeapBase`` has the same)."""

        __slots__ = ("heap", "nlive")

        heap: list[tuple[float, int, Timer]]
        nlive: int

    class _TimersFields:
        """A runtime's timer counts (the C accelerator's ``TimersBase`` has the same)."""

        __slots__ = ("narmed", "rt", "seq")

        rt: Runtime
        seq: int  # the last heap entry's number
        narmed: int  # armed timers over all Ps: wake sources

        if TYPE_CHECKING:
            # TimersBase's twins of Timers._add_py / _delete_py.
            def add(self, t: Timer, when: float) -> None: ...

            def delete(self, t: Timer) -> bool: ...

else:
    _TimerFields = speedups.TimerBase
    _TimerHeapFields = speedups.TimerHeapBase
    _TimersFields = speedups.TimersBase


class Timer(_TimerFields):
    """One runtime timer: ``f(arg, now)`` runs on the driver when it fires.

    ``Timer(f, arg, period=0.0, chan=None)``; armed and disarmed by the runtime's
    ``rt.timers.add``/``delete`` (:class:`Timers`; in C where the accelerator is built)."""

    __slots__ = ()

    def fire(self, now: float) -> None:
        """Run ``f(arg, now)``: the driver calls it when the timer is due."""
        self.f(self.arg, now)


class TimerHeap(_TimerHeapFields):
    """A min-heap of (when, seq, timer) with lazy deletion; see the module docstring.

    ``push`` and ``discard`` are the reference of what the C ``TimersBase.add`` and
    ``delete`` do to the heap (heapq's sift, the same rebuild rule)."""

    __slots__ = ()

    def __init__(self) -> None:
        self.heap = []
        self.nlive = 0

    def __len__(self) -> int:
        return self.nlive

    def push(self, t: Timer, when: float, seq: int) -> None:
        t.seq = seq
        t.armed = True
        t.when = when
        heapq.heappush(self.heap, (when, seq, t))
        self.nlive += 1

    def discard(self, t: Timer) -> None:
        """Disarm t; its entry becomes stale."""
        if not t.armed:
            return
        t.armed = False
        self.nlive -= 1
        if len(self.heap) > 64 and len(self.heap) > 2 * self.nlive + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the stale entries (more of them than live ones, see discard)."""
        heap = [e for e in self.heap if e[2].armed and e[2].seq == e[1]]
        heapq.heapify(heap)
        self.heap = heap

    def _clean_top(self) -> None:
        heap = self.heap
        while heap:
            _, seq, t = heap[0]
            if t.armed and t.seq == seq:
                return
            heapq.heappop(heap)

    def earliest(self) -> float:
        """When the earliest armed timer fires, or infinity."""
        self._clean_top()
        return self.heap[0][0] if self.heap else math.inf

    def pop_expired(self, now: float) -> Timer | None:
        """Disarm and return the earliest timer if it is due at ``now``, else None."""
        self._clean_top()
        heap = self.heap
        if heap and heap[0][0] <= now:
            _, _, t = heapq.heappop(heap)
            t.armed = False
            self.nlive -= 1
            return t
        return None

    def can_wake(self) -> bool:
        """Whether some armed timer can wake a goroutine: any timer that is not a channel
        timer (a sleep, an after_func, a context deadline), or a channel timer whose
        channel has a receiver waiting (a plain receive, or a select not yet done)."""
        for _, seq, t in self.heap:
            if not t.armed or t.seq != seq:
                continue
            ch = t.chan
            if ch is None:
                return True
            for w in ch._recvq:
                if not w.issel or not w.g.selectdone:
                    return True
        return False

    def drain(self) -> list[Timer]:
        """Remove and return every armed timer (still marked armed), earliest first."""
        live = sorted(
            (e for e in self.heap if e[2].armed and e[2].seq == e[1]), key=lambda e: (e[0], e[1])
        )
        self.heap = []
        self.nlive = 0
        out = []
        for _, _, t in live:
            t.armed = False
            out.append(t)
        return out


class Timers(_TimersFields):
    """The timers of one runtime (``rt.timers``): Go's ``addtimer``, ``deltimer`` and
    ``checkTimers`` over the per-P heaps, and the count of armed timers.

    Invariant: ``narmed`` is the sum of the Ps' heaps' ``nlive``.
    """

    __slots__ = ()

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.seq = 0
        self.narmed = 0

    def _add_py(self, t: Timer, when: float) -> None:
        """Arm t at ``when`` on the current P's heap (Go's addtimer / modtimer)."""
        if t.p is not None and t.armed:
            t.p.timers.discard(t)
            self.narmed -= 1
        self.seq += 1
        t.when = when
        p = self.rt.curp
        t.p = p
        p.timers.push(t, when, self.seq)
        self.narmed += 1

    def _delete_py(self, t: Timer) -> bool:
        """Disarm t; True when it was armed (it had not fired and was not stopped)."""
        if t.p is None or not t.armed:
            return False
        t.p.timers.discard(t)
        self.narmed -= 1
        return True

    # The C twins where built (a context's deadline, a sleep, an RPC call's timeout arm
    # and disarm one each); the methods above are the reference and the pure path.
    if speedups is None:
        add = _add_py
        delete = _delete_py

    def check(self, now: float) -> None:
        """Run every expired timer of every P, on that P (Go's checkTimers)."""
        rt = self.rt
        stats = rt.stats
        trace = rt.trace
        saved_p, saved_g = rt.curp, rt.curg
        rt.curg = None
        try:
            for p in rt.allp:
                heap = p.timers
                while True:
                    t = heap.pop_expired(now)
                    if t is None:
                        break
                    self.narmed -= 1
                    stats.ntimersfired += 1
                    rt.curp = p
                    if trace is not None:
                        trace.emit(rt, "timer", p.id, 0, 0, 0)
                    if t.period > 0:
                        # A ticker: next tick one period after the one missed most recently.
                        missed = max(0, math.floor((now - t.when) / t.period))
                        self.seq += 1
                        t.when += t.period * (missed + 1)
                        heap.push(t, t.when, self.seq)
                        self.narmed += 1
                    t.fire(now)
                if p.idle:
                    if p.runnext is not None or p.runq:
                        # A timer of an idle P readied a goroutine there: the P takes
                        # turns again (Go's M that slept until the timer takes a P).
                        rt.acquire_idle(p)
                    elif heap.nlive:
                        # Still idle, with timers left (a ticker's next tick, one
                        # armed while firing): the driver keeps watching them.
                        rt.pidle_when = min(rt.pidle_when, heap.earliest())
        finally:
            rt.curp, rt.curg = saved_p, saved_g

    def earliest(self) -> float:
        """When the earliest armed timer of any P fires, or infinity."""
        return min((p.timers.earliest() for p in self.rt.allp), default=math.inf)

    def can_wake(self) -> bool:
        """Whether some armed timer can wake a goroutine (see ``TimerHeap.can_wake``)."""
        return any(p.timers.can_wake() for p in self.rt.allp)

    def move(self, src: P, dst: P) -> None:
        """Move every armed timer of ``src`` (a P being destroyed) to ``dst``'s heap."""
        for t in src.timers.drain():
            self.seq += 1
            t.p = dst
            dst.timers.push(t, t.when, self.seq)
