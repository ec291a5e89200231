"""Processors: the P record (Go's ``p``) and the runtime fields the C accelerator keeps.

A P's ``runnext`` slot holds the G to run next (a woken partner, a new goroutine); its
local queue holds up to ``RUNQ_SIZE`` more; beyond that half of it spills to the global
queue (``runqputslow``). Everything that makes a G runnable on the current P goes
through the one ``Runtime.runqput`` (``gosim._core._runtime``): ``goready`` (a wake),
``newproc`` (``go``). Its C twin is ``runqput`` in ``gosim/_speedups_sched.c.h``, which
``goready`` and ``go`` there call; they spill through ``Runtime.runqput``.

Where the accelerator is built, ``P`` and ``Runtime`` subclass its ``PBase`` and
``RuntimeBase``, whose fields are C struct members the hot paths read without a
dictionary; ``_PFields`` and ``_RuntimeFields`` here are the pure-Python twins.

Mirrors Go's ``runtime2.go`` (``p``) and ``proc.go`` (``runqput``, ``runqputslow``).
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from gosim._core._accel import speedups
from gosim._core._g import G
from gosim._core._state import _CallBox
from gosim._core._timers import TimerHeap, Timers
from gosim._core._trace import Trace

ACTIVE_SPIN: Final = 4  # Go's active_spin: a lock spins at most this many times
DEFAULT_MAX_THREADS: Final = 10_000  # Go's default limit on threads (debug.SetMaxThreads)

if TYPE_CHECKING or speedups is None:

    class _PFields:
        """A processor's fields (the C accelerator's ``PBase`` has the same)."""

        __slots__ = ("gfree", "id", "runnext", "runq", "schedtick", "timers")

        runnext: G | None
        runq: deque[G]
        timers: TimerHeap
        gfree: list[G]
        id: int
        schedtick: int

    class _RuntimeFields:
        """What the hot paths read and write on a runtime (``RuntimeBase`` in C).

        Slots, as the C struct's members are: read without a dictionary, and they keep
        the runtime's instance dictionary (the rest of its fields) within the 30 keys
        CPython shares between instances; past those every attribute of the runtime is
        read through a hashed lookup, which cost the pure-Python channel paths 2%.
        """

        __slots__ = (
            "allg",
            "call_boxes",
            "curg",
            "curp",
            "gfree",
            "goidgen",
            "main_goexited",
            "nmspinning",
            "nswitch",
            "pidle",
            "rng",
            "timers",
            "trace",
        )

        curg: G | None
        curp: P
        trace: Trace | None
        allg: dict[int, G]
        call_boxes: dict[int, _CallBox]
        nswitch: int
        goidgen: int
        timers: Timers
        rng: random.Random
        main_goexited: bool
        gfree: list[G]  # global dead-G list (Go's sched.gFree)
        pidle: list[P]  # idle Ps, a stack (Go's sched.pidle)
        nmspinning: int  # spinning Ps (Go's sched.nmspinning): 0 or 1 here

        if TYPE_CHECKING:
            # RuntimeBase._burst (gosim/_speedups_sched.c.h); the pure-Python driver
            # never calls it.
            def _burst(self, p: P, g: G | None, burst_end: int) -> tuple[int, G, Any]: ...

    _burst_available = False
else:
    _PFields = speedups.PBase
    _RuntimeFields = speedups.RuntimeBase
    _burst_available = True


class P(_PFields):
    """A processor. Fields are touched only by the driver and by code running on this P.

    ``idle``: the P is on the runtime's ``pidle`` stack (Go's ``_Pidle``), holds no work
    and gets no turns until something wakes it. ``spinning``: woken by ``wakep`` to look
    for work to steal (Go's spinning M); it stops spinning when it finds some.
    """

    __slots__ = ("idle", "spinning")

    def __init__(self, pid: int) -> None:
        self.id = pid
        self.idle = False
        self.spinning = False
        # Invariant: runnext is not also in runq; len(runq) <= RUNQ_SIZE.
        self.runnext = None
        self.runq = deque()
        self.schedtick = 0
        self.timers = TimerHeap()
        self.gfree = []  # dead Gs for reuse (Go's p.gFree)

    def has_work(self) -> bool:
        return self.runnext is not None or bool(self.runq)
