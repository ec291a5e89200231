"""A runtime's statistics: its counters, the snapshot ``gosim.statistics`` returns, and
Go's ``schedtrace`` line.

A runtime holds one :class:`Stats` (``rt.stats``), which the parts that count bump:
steals (``Runtime.runqsteal``), preemptions (the driver), syscalls, hand-offs and trio
calls (``rt.syscalls``), fired timers (``rt.timers``). The context-switch count is not
here: it is the driver's tick (``rt.nswitch``), read by the hot loop and preemption.

Mirrors Go's ``schedtrace`` (``GODEBUG=schedtrace``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from gosim._core._runtime import Runtime


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


class Stats:
    """The counters of one runtime (see :class:`SchedStatistics`) and its schedtrace."""

    __slots__ = (
        "nhandoffs",
        "npreempt",
        "nsteals",
        "nstolen",
        "nsyscalls",
        "ntimersfired",
        "ntriocalls",
        "rt",
        "schedtrace_file",
        "schedtrace_interval",
        "schedtrace_next",
        "start_time",
    )

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.nsteals = 0
        self.nstolen = 0
        self.nhandoffs = 0
        self.npreempt = 0
        self.nsyscalls = 0
        self.ntriocalls = 0
        self.ntimersfired = 0
        self.start_time = 0.0  # the runtime's clock when its driver started
        self.schedtrace_interval = 0.0  # 0: no schedtrace
        self.schedtrace_next = math.inf
        self.schedtrace_file: IO[str] | None = None

    def snapshot(self) -> SchedStatistics:
        """An immutable snapshot of the queues and counters (trio's ``statistics()``)."""
        rt = self.rt
        local = tuple(len(p.runq) + (p.runnext is not None) for p in rt.allp)
        return SchedStatistics(
            procs=len(rt.allp),
            idle_procs=len(rt.pidle),
            goroutines=len(rt.allg),
            local_runq=local,
            global_runq=len(rt.globrunq),
            created=rt.goidgen,
            context_switches=rt.nswitch,
            steals=self.nsteals,
            goroutines_stolen=self.nstolen,
            handoffs=self.nhandoffs,
            preemptions=self.npreempt,
            syscalls=self.nsyscalls,
            trio_calls=self.ntriocalls,
            timers_fired=self.ntimersfired,
            threads=1 + rt.syscalls.nthreads_busy,
        )

    def schedtrace_line(self) -> str:
        """Go's ``SCHED`` line for now."""
        s = self.snapshot()
        ms = int((self.rt.now() - self.start_time) * 1000)
        queues = " ".join(str(n) for n in s.local_runq)
        return (
            f"SCHED {ms}ms: gomaxprocs={s.procs} idleprocs={s.idle_procs} threads={s.threads} "
            f"spinningthreads={self.rt.nmspinning} idlethreads=0 runqueue={s.global_runq} "
            f"[{queues}]"
        )

    def maybe_schedtrace(self, now: float) -> None:
        """Print the ``SCHED`` line when one is due at ``now``."""
        if now >= self.schedtrace_next:
            print(self.schedtrace_line(), file=self.schedtrace_file or sys.stderr, flush=True)
            self.schedtrace_next = now + self.schedtrace_interval
