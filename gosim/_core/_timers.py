"""Runtime timers and the per-P timer heap (Go's ``time.go`` timers, simplified).

A :class:`Timer` is armed at most once at a time on one P's :class:`TimerHeap`. When it
expires the driver calls ``timer.fire(now)`` on that P: sleeping goroutines are readied,
timer channels get a non-blocking send, ``after_func`` starts a goroutine. Periodic
timers (tickers) are re-armed one period after the last tick they covered.

Stopping or re-arming does not search the heap: the heap entry carries the sequence
number it was pushed with and an entry whose number no longer matches its timer's is
stale and skipped when it reaches the top (Go's ``timerModifiedLater`` / ``timerDeleted``
idea). The heap is rebuilt when stale entries outnumber live ones, so a timer reset
millions of times (an idle timeout, say) cannot grow it without bound.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gosim._core._accel import speedups

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

else:
    _TimerFields = speedups.TimerBase
    _TimerHeapFields = speedups.TimerHeapBase


class Timer(_TimerFields):
    """One runtime timer: ``f(arg, now)`` runs on the driver when it fires.

    ``Timer(f, arg, period=0.0, chan=None)``; armed and disarmed by the runtime's
    ``addtimer``/``deltimer`` (in C where the accelerator is built)."""

    __slots__ = ()

    def fire(self, now: float) -> None:
        self.f(self.arg, now)


class TimerHeap(_TimerHeapFields):
    """A min-heap of (when, seq, timer) with lazy deletion; see the module docstring.

    ``push`` and ``discard`` are the reference of what the C ``addtimer`` and
    ``deltimer`` do to the heap (heapq's sift, the same rebuild rule)."""

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
