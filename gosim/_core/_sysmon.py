"""What Go's ``sysmon`` and ``time.go`` keep an eye on: timers, preemption, statistics,
``schedtrace`` and ``procresize``.

Timers live on the heap of the P that armed them; the driver runs the expired ones
(``checktimers``) when it looks for work and every ``PERIODIC_MASK + 1`` switches.
Preemption is cooperative, as in Go before 1.14: gosim operations that complete at once
count down a small budget; when it runs out :meth:`Sysmon.preempt_check` asks whether
the running G has held its P for longer than the 10 ms slice (deterministic mode counts
operations instead of reading a clock). :meth:`Sysmon.statistics` is the snapshot
behind ``gosim.statistics`` and the ``SCHED`` line.

Mirrors Go's ``addtimer``/``deltimer``/``checkTimers``, ``sysmon``'s ``retake``,
``schedtrace`` and ``procresize``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Final

from gosim._core._runq import P, RunQueues, _burst_available
from gosim._core._state import OP_BUDGET
from gosim._core._timers import Timer

TIME_SLICE: Final = 0.010  # forcePreemptNS: 10 ms
DET_SLICE_OPS: Final = 10_000  # deterministic mode: operations that make one slice


@dataclass(frozen=True, slots=True)
class SchedStatistics:
    """An immutable snapshot of the scheduler, from :func:`gosim.statistics`.

    Counters run from the start of the runtime. ``local_runq`` has one length per P
    (``runnext`` counted), as in Go's ``schedtrace`` brackets.
    """

    procs: int
    idle_procs: int
    goroutines: int
    local_runq: tuple[int, ...]
    global_runq: int
    created: int
    context_switches: int
    steals: int
    goroutines_stolen: int
    handoffs: int
    preemptions: int
    syscalls: int
    trio_calls: int
    timers_fired: int
    threads: int


class Sysmon(RunQueues):
    """Timers, preemption, statistics, schedtrace and procresize of one runtime."""

    def _init_room(self) -> None:
        super()._init_room()
        self.check_switch = -1
        self.check_time = 0.0
        self.check_ops = 0
        self.timerseq = 0
        self.ntimers = 0  # live (armed) timers over all Ps: wake sources
        self.nthreads_busy = 0
        self.start_time = 0.0
        self._clock_now: Callable[[], float] = time.perf_counter
        self.now = self._clock_now
        self.schedtrace_interval = 0.0
        self.schedtrace_next = math.inf
        self.schedtrace_file: IO[str] | None = None
        # Counters (see SchedStatistics).
        self.nhandoffs = 0
        self.npreempt = 0
        self.nsyscalls = 0
        self.ntriocalls = 0
        self.ntimersfired = 0

    #: The runtime's clock in seconds: trio's clock (virtual under ``virtual_time``)
    #: once the driver runs. The clock's own function, not a method that calls it:
    #: ``rt.now()`` is read a few times per network request, and a method's frame
    #: doubled the cost of each read.
    now: Callable[[], float]

    # ---------------------------------------------------------------- timers

    def _addtimer_py(self, t: Timer, when: float) -> None:
        """Arm t at ``when`` on the current P's heap (Go's addtimer / modtimer)."""
        if t.p is not None and t.armed:
            t.p.timers.discard(t)
            self.ntimers -= 1
        self.timerseq += 1
        t.when = when
        p = self.curp
        t.p = p
        p.timers.push(t, when, self.timerseq)
        self.ntimers += 1

    def _deltimer_py(self, t: Timer) -> bool:
        """Disarm t; True when it was armed (it had not fired and was not stopped)."""
        if t.p is None or not t.armed:
            return False
        t.p.timers.discard(t)
        self.ntimers -= 1
        return True

    # The C twins where built (a context's deadline, a sleep, an RPC call's timeout arm
    # and disarm one each); the methods above are the reference and the pure path.
    if not _burst_available:  # else RuntimeBase's, inherited
        addtimer = _addtimer_py
        deltimer = _deltimer_py

    def checktimers(self, now: float) -> None:
        """Run every expired timer of every P, on that P (Go's checkTimers)."""
        saved_p, saved_g = self.curp, self.curg
        self.curg = None
        try:
            for p in self.allp:
                heap = p.timers
                while True:
                    t = heap.pop_expired(now)
                    if t is None:
                        break
                    self.ntimers -= 1
                    self.ntimersfired += 1
                    self.curp = p
                    if self.trace is not None:
                        self.trace.emit(self, "timer", p.id, 0, 0, 0)
                    if t.period > 0:
                        # A ticker: next tick one period after the one missed most recently.
                        missed = max(0, math.floor((now - t.when) / t.period))
                        self.timerseq += 1
                        t.when += t.period * (missed + 1)
                        heap.push(t, t.when, self.timerseq)
                        self.ntimers += 1
                    t.fire(now)
        finally:
            self.curp, self.curg = saved_p, saved_g

    def next_timer(self) -> float:
        return min((p.timers.earliest() for p in self.allp), default=math.inf)

    # ------------------------------------------------------------ preemption

    def preempt_check(self) -> bool:
        """Called when an op budget runs out: has the running G used up its slice?"""
        if self.check_switch != self.nswitch:
            self.check_switch = self.nswitch
            self.check_ops = 0
            if not self.deterministic:
                self.check_time = time.perf_counter()
            return False
        if self.deterministic:
            self.check_ops += OP_BUDGET
            return self.check_ops >= DET_SLICE_OPS
        return time.perf_counter() - self.check_time >= TIME_SLICE

    # ------------------------------------------------------------------ stats

    def statistics(self) -> SchedStatistics:
        """An immutable snapshot of the queues and counters (trio's ``statistics()``)."""
        local = tuple(len(p.runq) + (p.runnext is not None) for p in self.allp)
        idle = sum(1 for n in local if n == 0)
        if self.curg is not None and idle:
            idle -= 1  # the P running the caller is not idle
        return SchedStatistics(
            procs=len(self.allp),
            idle_procs=idle,
            goroutines=len(self.allg),
            local_runq=local,
            global_runq=len(self.globrunq),
            created=self.goidgen,
            context_switches=self.nswitch,
            steals=self.nsteals,
            goroutines_stolen=self.nstolen,
            handoffs=self.nhandoffs,
            preemptions=self.npreempt,
            syscalls=self.nsyscalls,
            trio_calls=self.ntriocalls,
            timers_fired=self.ntimersfired,
            threads=1 + self.nthreads_busy,
        )

    def schedtrace_line(self) -> str:
        s = self.statistics()
        ms = int((self.now() - self.start_time) * 1000)
        queues = " ".join(str(n) for n in s.local_runq)
        return (
            f"SCHED {ms}ms: gomaxprocs={s.procs} idleprocs={s.idle_procs} threads={s.threads} "
            f"spinningthreads=0 idlethreads=0 runqueue={s.global_runq} [{queues}]"
        )

    def _maybe_schedtrace(self, now: float) -> None:
        if now >= self.schedtrace_next:
            print(self.schedtrace_line(), file=self.schedtrace_file or sys.stderr, flush=True)
            self.schedtrace_next = now + self.schedtrace_interval

    # --------------------------------------------------------------- procresize

    def procresize(self, n: int) -> int:
        """Change the number of Ps to n; return the old number (Go's procresize)."""
        if n < 1:
            raise ValueError(f"gomaxprocs: n must be at least 1, got {n}")
        old = len(self.allp)
        if n > old:
            self.allp.extend(P(i) for i in range(old, n))
        elif n < old:
            for p in self.allp[n:]:
                # Destroyed Ps give their work, timers and free Gs to the survivors.
                if p.runnext is not None:
                    self.globrunq.append(p.runnext)
                    p.runnext = None
                self.globrunq.extend(p.runq)
                p.runq.clear()
                self.gfree.extend(p.gfree)
                p.gfree.clear()
                for t in p.timers.drain():
                    self.timerseq += 1
                    t.p = self.allp[0]
                    self.allp[0].timers.push(t, t.when, self.timerseq)
            del self.allp[n:]
            if self.curp.id >= n:
                self.curp = self.allp[0]
        return old
