"""The runtime: Gs, Ps and the logical M that a single trio task drives; how to run one.

Glossary
--------
G  a goroutine (:mod:`._g`): a native coroutine plus its record.
P  a processor: the right to run Go code, with a local run queue (256 slots), a
   ``runnext`` slot, a timer heap and a cache of dead Gs. ``procs`` of them exist.
M  the thing that runs a P. Under the GIL the Ms that run Go code are logical: one trio
   task, the *driver*, interleaves the Ps round-robin on the trio thread. Blocking
   calls (:func:`syscall`) run on real OS threads from trio's thread pool.

The runtime and what it holds
----------------------------
One :class:`Runtime` object (this module) holds the scheduler's state: the Ps and run
queues, the goroutines, the driver's state, and its methods are Go's ``runqput`` (the
one way onto a P), ``goready``, ``newproc``, the free Gs and ``goexit0``, preemption
and ``procresize``. The parts with state of their own are objects it holds:

``rt.timers``    :class:`~._timers.Timers`: the armed-timer count and Go's
                 ``addtimer``/``deltimer``/``checkTimers`` over the per-P heaps;
``rt.syscalls``  :class:`~._syscall.Syscalls`: syscalls on threads, trio calls, the
                 thread limiter and the virtual clock's hold;
``rt.stats``     :class:`~._stats.Stats`: the counters behind ``gosim.statistics``
                 and the ``SCHED`` line;
``rt.signals``   :class:`~._signal.SignalQueue`: the OS signal handlers and the
                 signals caught and not yet relayed (``gosim.signal``);
``rt.runvars``   the values of the layers above (the heap, the simulated network),
                 each under its typed :class:`RuntimeVar`.

The driver is :mod:`._schedule`'s functions over a runtime (Go's ``schedule``,
``findRunnable``, idling, exits, panics, deadlock); :mod:`._runq` has the P record,
:mod:`._state` the per-thread ``_state.rt``, the traps and the sizes the C accelerator
is configured with. This module also has ``run``, ``open_runtime`` and its handle, and
the goroutine-facing functions (``go``, ``gosched``, ``statistics``...).

``_dump`` words crash output as Go does. Upper layers (channels, select, time, sync,
net) reach all this through :mod:`gosim.lowlevel` only.

Deterministic mode (``seed=``): steal victims and select choices come from one seeded
``random.Random`` (the Ps take turns in the order they started looking for work),
syscalls and trio calls run inline on the driver, time is virtual (trio's
``MockClock``), so the same program at the same ``procs`` takes the same schedule and
writes the same trace bytes on every run. A *chooser* (``rt.chooser``, set through
``gosim.lowlevel.set_chooser``) may then decide which runnable goroutine runs at each
switch (``_schedule._choose``): schedule exploration (``gosim.testing``) drives the
runtime through it.

Mirrors Go's ``proc.go`` (``newproc``, ``gosched``, ``goexit``, ``GOMAXPROCS``) and
the program start of ``runtime.main``.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from types import CoroutineType as _CoroutineType
from typing import IO, TYPE_CHECKING, Any, Final, Generic, NoReturn, TypeVar

import trio

from gosim._core import _g, _schedule
from gosim._core._accel import speedups
from gosim._core._dump import describe_fn, goroutine_dump
from gosim._core._exceptions import NotInRuntime, Panic, throw
from gosim._core._g import DEAD, RUNNABLE, WAITING, G
from gosim._core._netpoll import NetPoller
from gosim._core._runq import (
    ACTIVE_SPIN,
    DEFAULT_MAX_THREADS,
    P,
    _burst_available,
    _RuntimeFields,
)
from gosim._core._signal import SignalQueue
from gosim._core._state import (
    GFREE_LOCAL_MAX,
    GOSCHED,
    OP_BUDGET,
    PREEMPT,
    RUNQ_SIZE,
    _CallBox,
    _Goexit,
    _state,
    _trap,
    current_runtime,
)
from gosim._core._stats import SchedStatistics, Stats
from gosim._core._syscall import Syscalls
from gosim._core._timers import Timers
from gosim._core._trace import Trace

T = TypeVar("T")

GC_YOUNG_THRESHOLD: Final = 10_000  # run() paces CPython's young GC like this (see run)
TIME_SLICE: Final = 0.010  # forcePreemptNS: 10 ms
DET_SLICE_OPS: Final = 10_000  # deterministic mode: operations that make one slice


class Runtime(_RuntimeFields):
    """One scheduler instance: its Ps and run queues, the driver's state, and the parts
    it holds (``timers``, ``syscalls``, ``stats``).

    Made by :func:`open_runtime` (and :func:`gosim.run`); user code reaches it through
    the module functions (``go``, ``statistics``...) or through ``rt.call`` from trio.
    """

    #: The runtime's clock in seconds: trio's clock (virtual under ``virtual_time``)
    #: once the driver runs. The clock's own function, not a method that calls it:
    #: ``rt.now()`` is read a few times per network request, and a method's frame
    #: doubled the cost of each read.
    now: Callable[[], float]

    def __init__(
        self,
        procs: int,
        seed: int | None,
        trace: Trace | None,
        deterministic: bool,
        max_threads: int = DEFAULT_MAX_THREADS,
    ) -> None:
        if procs < 1:
            raise ValueError(f"procs must be at least 1, got {procs}")
        self.rng = random.Random(seed)
        self.deterministic = deterministic
        self.trace = trace
        # Run queues (Go's sched and allp).
        self.allp: list[P] = [P(i) for i in range(procs)]
        # The Ps that hold an M, in the order the driver gives them turns; the others are
        # idle on pidle, P1 on top (Go's procresize at start: only main's P runs).
        self.running: deque[P] = deque(self.allp[:1])
        self.pidle = []
        for p in reversed(self.allp[1:]):
            p.idle = True
            self.pidle.append(p)
        self.nmspinning = 0
        # No later than the earliest armed timer on an idle P's heap (infinity when there
        # is none): the driver checks the clock against it once a turn (schedule). Early
        # is harmless: it is recomputed when reached.
        self.pidle_when = math.inf
        self.globrunq: deque[G] = deque()
        self.gfree: list[G] = []  # global dead-G list (Go's sched.gFree)
        self.allg: dict[int, G] = {}  # live goroutines by goid (Go's allgs)
        self.goidgen = 0
        self.curg: G | None = None
        self.curp: P = self.allp[0]
        self.injectq: list[G] = []  # Gs readied from trio tasks, drained by the driver
        # Goroutines whose outcome a caller awaits (main under run, rt.call), by goid.
        self.call_boxes: dict[int, _CallBox] = {}
        self.main_goexited = False
        self.nswitch = 0  # the driver's tick: context switches so far
        # The parts with state of their own.
        self.timers = Timers(self)
        self.syscalls = Syscalls(self, max_threads)
        self.stats = Stats(self)
        self.signals = SignalQueue(self)
        # Per-runtime values of the layers above the core (the heap, the simulated
        # network), each under its own typed RuntimeVar.
        self.runvars: dict[RuntimeVar[Any], Any] = {}
        # Preemption (preempt_check): the switch and the start of the slice it measures.
        self.check_switch = -1
        self.check_time = 0.0
        self.check_ops = 0
        # The driver (gosim._core._schedule).
        self._clock_now: Callable[[], float] = time.perf_counter
        self.now = self._clock_now
        self.netpoller: NetPoller | None = None
        # While the driver idles in trio: the cancel scope that anything readying a G
        # from outside (inject, shutdown) cancels to wake it.
        self.idle_scope: trio.CancelScope | None = None
        self.last_trio_yield = 0.0
        self.stopped = False
        self.failure: BaseException | None = None
        self.main_g: G | None = None
        self.open_mode = True  # False under gosim.run: main's return ends the runtime
        #: Under ``gosim.run(virtual_time=True)``: the MockClock's ``jump``, which the
        #: driver calls itself when no other trio task can act (see _schedule._idle).
        self.virtual_jump: Callable[[float], None] | None = None
        #: Deterministic mode only (``lowlevel.set_chooser``): decides which runnable
        #: goroutine runs at every switch with more than one; None is Go's order.
        self.chooser: Callable[[list[int]], int] | None = None
        if _burst_available:
            # An instance of a subclass of a C type gets from CPython 3.11 a dictionary
            # whose keys are shared with its class (a split table), which the
            # interpreter's attribute caches cannot read: every ``rt.x`` took the
            # generic lookup, ten times the cost of a cached one (the driver reads a
            # dozen per turn). A dictionary of its own is read through a cached hint.
            self.__dict__ = dict(self.__dict__)

    # ------------------------------------------------------------------ driver

    async def drive(self) -> None:
        """The driver task: Go's schedule loop over all Ps until the runtime stops."""
        await _schedule.drive(self)

    def close_all(self) -> None:
        """Close every live goroutine's coroutine so its ``finally`` blocks run."""
        _schedule.close_all(self)

    def goroutine_dump(self) -> str:
        """Go's crash-dump listing: one stanza per goroutine with its state."""
        return goroutine_dump(self.allg.values())

    # -------------------------------------------------------------- run queues

    def runqput(self, p: P, g: G, next_: bool) -> None:
        """Put g on p's local queue (``runnext`` when ``next_``). Executed only for the current P.

        A kicked-out ``runnext`` goes to the tail; a full queue moves half of itself and g
        to the global queue (``runqputslow``). The one copy in Python of Go's ``runqput``:
        ``goready`` and ``newproc`` put through it; ``runqput`` in ``gosim/_speedups_sched.c.h``
        is its C twin.
        """
        if next_:
            old = p.runnext
            p.runnext = g
            if old is None:
                return
            g = old
        q = p.runq
        if len(q) < RUNQ_SIZE:
            q.append(g)
        else:
            # runqputslow: move half of the local queue, then g, to the global queue.
            half = len(q) // 2
            popleft = q.popleft
            batch = [popleft() for _ in range(half)]
            batch.append(g)
            self.globrunq.extend(batch)
        if self.pidle and not self.nmspinning:
            # A G another P could take: wake one to steal it (Go's ready and newproc
            # call wakep; a G only in runnext is never stolen here, so waking a P for
            # it would only have it find nothing).
            self.wakep()

    def runqget(self, p: P) -> G | None:
        """Go's ``runqget``: p's ``runnext``, else the head of its local queue, else None.

        The driver's hot loop (``_schedule.schedule``, ``_python_burst``, the C
        ``_burst``) writes these few lines out rather than pay a call per switch.
        """
        g = p.runnext
        if g is not None:
            p.runnext = None
            return g
        if p.runq:
            return p.runq.popleft()
        return None

    def globrunqget(self, p: P, maximum: int) -> G | None:
        """Take a batch from the global queue: one to run, the rest to p's local queue."""
        gq = self.globrunq
        n = min(len(gq), len(gq) // len(self.allp) + 1, RUNQ_SIZE // 2)
        if maximum > 0:
            n = min(n, maximum)
        if n == 0:
            return None
        popleft = gq.popleft
        g = popleft()
        if n > 1:
            p.runq.extend([popleft() for _ in range(n - 1)])
        return g

    def runqsteal(self, thief: P, victim: P, steal_runnext: bool) -> G | None:
        """Steal half (rounded up) of victim's local queue into thief's; return one to run."""
        vq = victim.runq
        n = len(vq) - len(vq) // 2
        if n == 0:
            if not steal_runnext or victim.runnext is None:
                return None
            g = victim.runnext
            victim.runnext = None
            self.stats.nsteals += 1
            self.stats.nstolen += 1
            if self.trace is not None:
                self.trace.emit(self, "steal", thief.id, g.goid, victim.id, 1)
            return g
        stolen = [vq.popleft() for _ in range(n)]
        stats = self.stats
        stats.nsteals += 1
        stats.nstolen += n
        if self.trace is not None:
            self.trace.emit(self, "steal", thief.id, stolen[-1].goid, victim.id, n)
        g = stolen.pop()
        thief.runq.extend(stolen)
        return g

    def goready(self, g: G, param: Any) -> None:
        """Make a waiting g runnable on the current P's ``runnext``, handing it ``param``.

        Go's ``goready``: ``runqput(p, g, next=True)``, so a woken partner runs next.
        """
        g.param = param
        g.status = RUNNABLE
        p = self.curp
        if self.trace is not None:
            self.trace.emit(self, "ready", p.id, g.goid, 0, 0)
        self.runqput(p, g, True)

    if _burst_available:
        # The C twin (trace events included) where built: the netpoller readies a
        # goroutine per I/O event through here.
        goready = _RuntimeFields.goready  # type: ignore[attr-defined]

    def globready(self, g: G, param: Any) -> None:
        """Make a waiting g runnable at the tail of the global queue, handing it ``param``.

        Go's ``injectglist`` from sysmon, which has no P: goroutines whose I/O became
        ready while every P was busy queue behind the ones already waiting there, in
        order. Readying them onto the current P instead would let each new I/O event
        pass goroutines that a full local queue had spilled to the global queue, which
        gets one turn in FAIRNESS_TICKS while the local queue has work: under sustained
        load those would wait for seconds.
        """
        g.param = param
        g.status = RUNNABLE
        if self.trace is not None:
            self.trace.emit(self, "ready", self.curp.id, g.goid, 0, 0)
        self.globrunq.append(g)
        if self.pidle and not self.nmspinning:
            self.wakep()  # injectglist starts an idle P for the work it queued

    if _g.DEBUG and not TYPE_CHECKING:
        # GOSIM_DEBUG: the preconditions Go throws on, checked around the one runqput
        # and goready (the C twins check the same in C).
        _runqput_unchecked = runqput

        @functools.wraps(_runqput_unchecked)  # help() shows the reference's docstring
        def runqput(self, p: P, g: G, next_: bool) -> None:
            if g.status != RUNNABLE:
                raise throw(f"runqput: goroutine {g.goid} is {_g.STATUS_NAMES[g.status]}")
            self._runqput_unchecked(p, g, next_)

        _goready_unchecked = goready

        @functools.wraps(_goready_unchecked)
        def goready(self, g: G, param: Any) -> None:
            if g.status != WAITING:
                raise throw(f"goready: goroutine {g.goid} is {_g.STATUS_NAMES[g.status]}")
            self._goready_unchecked(g, param)

        _globready_unchecked = globready

        @functools.wraps(_globready_unchecked)
        def globready(self, g: G, param: Any) -> None:
            if g.status != WAITING:
                raise throw(f"globready: goroutine {g.goid} is {_g.STATUS_NAMES[g.status]}")
            self._globready_unchecked(g, param)

    def can_spin(self, iteration: int) -> bool:
        """Go's ``sync_runtime_canSpin``: may a lock spin (yield) once more before parking?

        Only when it can pay off: fewer than ``ACTIVE_SPIN`` spins so far, more than one
        P, another P running (neither idle nor spinning: Go's ``gomaxprocs >
        npidle + nmspinning + 1``), and nothing queued on the caller's own P.
        """
        nump = len(self.allp)
        if iteration >= ACTIVE_SPIN or nump <= len(self.pidle) + self.nmspinning + 1:
            return False
        p = self.curp
        return p.runnext is None and not p.runq

    # ---------------------------------------------------------------- idle Ps

    def wakep(self) -> None:
        """Go's ``wakep``: when no P is spinning, take an idle P and let it spin.

        The woken P gets a turn after the running ones and looks for work
        (``findrunnable``: the global queue, the netpoller, stealing); when it finds
        some it stops spinning and wakes the next (``resetspinning``), when not it goes
        back to ``pidle``. One spinning P at a time, as Go's ``nmspinning`` check keeps
        it, so a burst of new work wakes the Ps one by one, each as the last one found
        something.
        """
        if self.nmspinning or not self.pidle:
            return
        p = self.pidle.pop()
        p.idle = False
        p.spinning = True
        self.nmspinning += 1
        self.running.append(p)

    def resetspinning(self, p: P) -> None:
        """Go's ``resetspinning``: spinning p found work; wake another P if it was the
        last one spinning, so work that is still queued gets taken."""
        self.stopspinning(p)
        if not self.nmspinning and self.pidle:
            self.wakep()

    def stopspinning(self, p: P) -> None:
        """p no longer spins (it found work, goes idle, idles the driver or is gone)."""
        if p.spinning:
            p.spinning = False
            self.nmspinning -= 1

    def pidleput(self, p: P) -> None:
        """p found no work: it goes idle (Go's ``pidleput``, with ``stopm``). It gets no
        turn until ``wakep``, a timer of its heap, or a goroutine coming back to it
        (``_drain_inject``) takes it off ``pidle``."""
        if _g.DEBUG and (p.runnext is not None or p.runq):
            raise throw(f"pidleput: P {p.id} has work")
        self.stopspinning(p)
        p.idle = True
        self.pidle.append(p)
        if p.timers.nlive:
            # Its timers still fire on time, while the running Ps are busy (Go's M asleep
            # in netpoll until the earliest timer).
            self.pidle_when = min(self.pidle_when, p.timers.earliest())

    def acquire_idle(self, p: P) -> None:
        """Take the idle p off ``pidle`` and give it turns again, not spinning (Go's
        ``pidlegetSpinning`` for a given P: exitsyscall's old P, a P whose timer
        readied a goroutine on it)."""
        self.pidle.remove(p)
        p.idle = False
        self.running.append(p)

    def inject(self, g: G, param: Any) -> None:
        """Ready g from outside the driver (a trio task): queue it and wake the driver."""
        g.param = param
        self.injectq.append(g)
        self.wake()

    def wake(self) -> None:
        """Wake the driver if it is idling in trio (safe to call from any trio task)."""
        scope = self.idle_scope
        if scope is not None:
            scope.cancel()

    def _drain_inject(self) -> None:
        # exitsyscall: prefer the G's old P if it is idle, else the global queue.
        q = self.injectq
        self.injectq = []
        queued = False
        for g in q:
            if g.status != RUNNABLE:  # rt.call's new G is runnable already
                g.status = RUNNABLE
            old = g.p
            if old is not None and old in self.allp and not old.has_work():
                old.runnext = g
                if old.idle:
                    self.acquire_idle(old)
            else:
                self.globrunq.append(g)
                queued = True
        if queued and self.pidle and not self.nmspinning:
            self.wakep()

    # -------------------------------------------------------------- newproc

    def newproc(
        self,
        fn: Callable[..., Coroutine[Any, Any, Any]],
        args: tuple[Any, ...],
        parent: int,
        coro: Any = None,
    ) -> G:
        """Create a goroutine running fn(*args) and put it in the current P's runnext.

        ``coro``, when given, is ``fn(*args)`` already called (by ``go``). ``go`` in
        ``gosim/_speedups_sched.c.h`` is the C twin of ``go`` and this function.
        """
        if coro is None:
            coro = fn(*args)
        if type(coro) is not _CoroutineType and not isinstance(coro, Coroutine):
            if hasattr(coro, "close"):
                coro.close()
            raise TypeError(
                f"go: {describe_fn(fn)} must be an async function (returning a coroutine), "
                f"got {type(coro).__name__}"
            )
        p = self.curp
        g = self.gfget(p)
        self.goidgen = goid = self.goidgen + 1
        g.goid = goid
        g.coro = coro
        g.parent = parent
        curg = self.curg
        g.creator = curg.coro if curg is not None else None
        g.status = RUNNABLE
        self.allg[goid] = g
        if self.trace is not None:
            self.trace.emit(self, "go", p.id, goid, parent, 0)
        self.runqput(p, g, True)
        return g

    def gfget(self, p: P) -> G:
        """A dead G from p's free list (refilled from the global list), or a new one."""
        if p.gfree:
            return p.gfree.pop()
        if self.gfree:
            n = min(len(self.gfree), GFREE_LOCAL_MAX // 2)
            for _ in range(n):
                p.gfree.append(self.gfree.pop())
            return p.gfree.pop()
        return G()

    def goexit0(self, g: G, p: P) -> None:
        """Retire g: drop it from allg, clear its references, put it on p's free list.

        The one copy in Python (the driver's loop calls it); ``goexit0`` in
        ``gosim/_speedups_sched.c.h`` is the C twin.
        """
        g.status = DEAD
        g.coro = None
        g.param = None
        g.elem = None
        g.fn = None
        g.p = None
        del self.allg[g.goid]
        if self.trace is not None:
            self.trace.emit(self, "exit", p.id, g.goid, 0, 0)
        p.gfree.append(g)
        if len(p.gfree) >= GFREE_LOCAL_MAX:
            self._gfput_spill(p)

    def _gfput_spill(self, p: P) -> None:
        """gfput: p's free list is long; move half to the global list for other Ps."""
        lst = p.gfree
        half = len(lst) // 2
        self.gfree.extend(lst[half:])
        del lst[half:]

    # ------------------------------------------------------------ preemption

    def preempt_check(self) -> bool:
        """Called when an op budget runs out: has the running G used up its slice?

        Preemption is cooperative, as in Go before 1.14: gosim operations that complete
        at once count down a small budget, and at zero this asks whether the running G
        has held its P for longer than the 10 ms slice (deterministic mode counts
        operations instead of reading a clock). Go's ``sysmon`` ``retake``.
        """
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

    # --------------------------------------------------------------- procresize

    def procresize(self, n: int) -> int:
        """Change the number of Ps to n; return the old number (Go's procresize)."""
        if n < 1:
            raise ValueError(f"gomaxprocs: n must be at least 1, got {n}")
        old = len(self.allp)
        if n > old:
            new = [P(i) for i in range(old, n)]
            self.allp.extend(new)
            for p in reversed(new):  # idle until woken, the lowest on top
                p.idle = True
                self.pidle.append(p)
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
                self.timers.move(p, self.allp[0])
                if p.idle:
                    self.pidle.remove(p)
                elif p in self.running:
                    self.running.remove(p)
                self.stopspinning(p)
                p.idle = False
            del self.allp[n:]
            first = self.allp[0]
            if first.idle and first.timers.nlive:  # it took the destroyed Ps' timers
                self.pidle_when = min(self.pidle_when, first.timers.earliest())
            if self.curp.id >= n:
                # The caller's P is gone: it goes on on P0 (Go's procresize), which
                # takes turns again if it was idle.
                self.curp = self.allp[0]
                if self.curp.idle:
                    self.acquire_idle(self.curp)
            if self.globrunq and self.pidle and not self.nmspinning:
                self.wakep()
        return old


class RuntimeVar(Generic[T]):
    """A value per runtime, as trio's ``RunVar`` is one per run: the layers above the
    core keep their per-runtime state (the heap, the simulated network) under one,
    typed, instead of in fields of the runtime.

    ``get`` answers the running runtime's value, or None while it has none; ``set``
    sets it. Outside a runtime both raise :class:`NotInRuntime`. ``get_in`` and
    ``set_in`` do the same on a runtime at hand.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def get(self) -> T | None:
        """The running runtime's value, or None while it has none; :class:`NotInRuntime`
        outside a runtime."""
        return current_runtime().runvars.get(self)

    def set(self, value: T) -> None:
        """Set the running runtime's value; :class:`NotInRuntime` outside a runtime."""
        current_runtime().runvars[self] = value

    def get_in(self, rt: Runtime) -> T | None:
        """``rt``'s value, or None while it has none."""
        return rt.runvars.get(self)

    def set_in(self, rt: Runtime, value: T) -> None:
        """Set ``rt``'s value."""
        rt.runvars[self] = value

    def __repr__(self) -> str:
        return f"<RuntimeVar name={self._name!r}>"


@asynccontextmanager
async def open_runtime(
    procs: int | None = None,
    seed: int | None = None,
    trace: Trace | None = None,
    max_threads: int = DEFAULT_MAX_THREADS,
) -> AsyncIterator[RuntimeHandle]:
    """Run a gosim runtime inside an existing trio program for the duration of the block.

    ``await rt.call(fn, *args)`` runs ``fn`` as a goroutine and returns its result. On
    leaving the block the runtime stops and remaining goroutines are closed. A panic or
    deadlock in the runtime makes pending calls raise it and is raised on leaving.
    ``seed`` makes the runtime's random choices reproducible (use ``gosim.run`` with
    ``virtual_time=True`` for fully deterministic runs).
    """
    rt = Runtime(
        _resolve_procs(procs), seed, trace, deterministic=seed is not None, max_threads=max_threads
    )
    handle = RuntimeHandle(rt)
    try:
        async with trio.open_nursery() as nursery:
            rt.syscalls.nursery = nursery
            nursery.start_soon(handle._drive_and_notify)
            try:
                yield handle
            finally:
                rt.stopped = True
                rt.wake()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Only the block's own exception can be in here (the runtime's tasks record
        # their failures instead of raising); give it back unwrapped.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        rt.close_all()
    if rt.failure is not None and not handle._failure_delivered:
        raise rt.failure


def _start_coroutine(fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> Any:
    coro = fn(*args)
    if not isinstance(coro, Coroutine):
        raise TypeError(f"{describe_fn(fn)} must be an async function, got {type(coro).__name__}")
    return coro


def _resolve_procs(procs: int | None) -> int:
    if procs is None:
        return os.cpu_count() or 1
    if not isinstance(procs, int) or procs < 1:
        raise ValueError(f"procs must be a positive int, got {procs!r}")
    return procs


class RuntimeHandle:
    """The trio-side handle of a runtime opened with :func:`open_runtime`."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._pending: list[_CallBox] = []
        self._failure_delivered = False

    @property
    def runtime(self) -> Runtime:
        """The runtime this handle drives (its goroutines, clock and statistics)."""
        return self._rt

    async def _drive_and_notify(self) -> None:
        rt = self._rt
        try:
            await rt.drive()
        finally:
            rt.stopped = True
            for box in self._pending:
                box.done.set()

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` as a goroutine; return its result or raise what it raised.

        An exception escaping ``fn`` is delivered to this caller and does not stop the
        runtime; an exception escaping another goroutine, or a deadlock, stops it and is
        raised here: that exception itself (with the crash report as a note, as
        :func:`run` raises it) or :class:`Deadlock`.
        """
        rt = self._rt
        if rt.stopped:
            raise (
                rt.failure if rt.failure is not None else RuntimeError("gosim runtime has stopped")
            )
        box = _CallBox()
        self._pending.append(box)
        g = rt.gfget(rt.allp[0])
        rt.goidgen += 1
        g.goid = rt.goidgen
        g.coro = _start_coroutine(fn, args)
        g.parent = 0
        g.param = None
        rt.allg[g.goid] = g
        rt.call_boxes[g.goid] = box
        g.status = RUNNABLE
        rt.inject(g, None)
        try:
            await box.done.wait()
        finally:
            self._pending.remove(box)
        if box.result is not None:
            return box.result.unwrap()  # type: ignore[no-any-return]
        if rt.failure is not None:
            self._failure_delivered = True
            raise rt.failure
        raise RuntimeError("gosim runtime stopped before the call finished")


def run(
    main: Callable[..., Awaitable[T]],
    *args: Any,
    procs: int | None = None,
    seed: int | None = None,
    virtual_time: bool = False,
    trace: Trace | None = None,
    schedtrace: float | None = None,
    gc_young_threshold: int | None = GC_YOUNG_THRESHOLD,
) -> T:
    """Run ``main(*args)`` as goroutine 1 on a fresh runtime and return its result.

    As in Go, the program ends when main returns: other goroutines are closed (their
    ``finally`` blocks run). An exception escaping any goroutine (Go's unrecovered panic)
    stops the runtime, closes the other goroutines and is raised here as itself: its own
    type, the same object, so ``except OSError`` around ``run`` catches a goroutine's
    ``OSError``. Go's crash report (``panic: ...``, ``goroutine N [running]:``, the
    function and the goroutine that started it) is added to it as a note
    (``add_note``), which the traceback shows. ``gosim.panic(value)`` with a value that
    is not an exception raises :class:`Panic`, which arrives the same way. When nothing
    can run, :class:`Deadlock`. ``procs`` defaults to
    the CPU count (Go's GOMAXPROCS). ``seed`` fixes every random choice; with
    ``virtual_time=True`` time is virtual too, and the run is fully reproducible for
    the same ``procs`` (give it explicitly to replay a seed on another machine).
    ``schedtrace`` prints Go's ``SCHED`` line to stderr every that many seconds.

    While it runs, CPython's young-generation GC threshold is raised to at least
    ``gc_young_threshold`` (restored afterwards; None leaves the GC alone). Goroutines
    are GC-tracked objects born in bulk, and the default threshold of 700 made the
    cyclic collector half the cost of spawning 100,000 of them when this default was
    chosen; cycles are still collected, just in larger batches, as Go's GOGC paces its GC.
    """
    nprocs = _resolve_procs(procs)
    clock = None
    if virtual_time:
        # Imported only here: trio.testing pulls in pytest when it is installed.
        from trio.testing import MockClock  # noqa: PLC0415

        clock = MockClock(autojump_threshold=0)

    async def top() -> T:
        rt = Runtime(nprocs, seed, trace, deterministic=seed is not None)
        rt.open_mode = False
        if clock is not None:
            rt.virtual_jump = clock.jump
        if schedtrace:
            rt.stats.schedtrace_interval = schedtrace
        box = _start_main(rt, main, args)
        try:
            async with trio.open_nursery() as nursery:
                rt.syscalls.nursery = nursery
                try:
                    await rt.drive()
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            rt.close_all()
        if rt.failure is not None:
            raise rt.failure
        if box.result is None:
            raise RuntimeError("gosim: main did not finish")  # pragma: no cover - guarded by drive
        return box.result.unwrap()  # type: ignore[no-any-return]

    saved_gc = gc.get_threshold()
    if gc_young_threshold is not None and gc_young_threshold > saved_gc[0]:
        gc.set_threshold(gc_young_threshold, *saved_gc[1:])
    try:
        return trio.run(top, clock=clock)
    except BaseExceptionGroup as group:  # pragma: no cover - runtime tasks never raise
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        gc.set_threshold(*saved_gc)


def _start_main(
    rt: Runtime, main: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
) -> _CallBox:
    """``main(*args)`` as goroutine 1, runnable in the first P's ``runnext`` and
    ``rt.main_g``; the box its result is delivered to."""
    box = _CallBox()
    g = rt.gfget(rt.allp[0])
    rt.goidgen = 1
    g.goid = 1
    g.coro = _start_coroutine(main, args)
    g.status = RUNNABLE
    rt.allg[1] = g
    rt.call_boxes[1] = box
    rt.main_g = g
    rt.allp[0].runnext = g
    return box


# ------------------------------------------------------------------ user API


def go(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
    """Start ``fn(*args)`` as a new goroutine (Go's ``go`` statement); returns None.

    The new goroutine goes to the current P's ``runnext``: it runs when the caller next
    blocks or yields, before older runnable goroutines, as in Go.
    """
    rt = _state.rt
    if rt is None:
        raise NotInRuntime("go: not inside a gosim goroutine (use gosim.run or rt.call)")
    curg = rt.curg
    parent = curg.goid if curg is not None else 0
    coro: Any = fn(*args)
    rt.newproc(fn, args, parent, coro)


if not TYPE_CHECKING and speedups is not None:
    go = speedups.go  # the same newproc in C (gosim/_speedups_sched.c.h), same contract


async def gosched() -> None:
    """Yield the processor: the caller goes to the global run queue (Go's Gosched)."""
    if _state.rt is None:
        raise NotInRuntime("gosched: not inside a gosim goroutine")
    await _trap(GOSCHED)


def goexit() -> None:
    """End the calling goroutine after its ``finally`` blocks run (Go's Goexit).

    It raises an exception that must not be caught (it derives from ``BaseException``).
    Called from main, the program continues until the other goroutines finish, then
    fails as Go's does: ``no goroutines (main called runtime.Goexit) - deadlock!``.
    """
    rt = _state.rt
    if rt is None or rt.curg is None:
        raise NotInRuntime("goexit: not inside a gosim goroutine")
    raise _Goexit()


def panic(value: object) -> NoReturn:
    """Go's ``panic(value)``: raise ``value`` if it is an exception, else :class:`Panic`.

    An exception is raised as itself (Go's ``panic(err)``); any other value (a string, a
    number) is carried by a :class:`Panic` whose ``value`` it is and whose ``goid`` is
    the calling goroutine's (None outside one). Caught inside the goroutine, it is
    recovered, as by a deferred ``recover()`` in Go; uncaught, it stops the runtime and
    :func:`run` raises it, with Go's crash report as a note.
    """
    if isinstance(value, BaseException):
        raise value
    rt = _state.rt
    g = None if rt is None else rt.curg
    raise Panic(value, None if g is None else g.goid)


def gomaxprocs(n: int | None = None) -> int:
    """Set the number of Ps to n (when given and positive); return the previous number."""
    rt = current_runtime()
    if n is None or n == 0:
        return len(rt.allp)
    return rt.procresize(n)


def num_goroutine() -> int:
    """The number of goroutines that exist now (Go's NumGoroutine)."""
    return len(current_runtime().allg)


def goid() -> int:
    """The calling goroutine's id (1 is main)."""
    rt = current_runtime()
    if rt.curg is None:
        raise NotInRuntime("goid: not inside a gosim goroutine")
    return rt.curg.goid


def statistics() -> SchedStatistics:
    """An immutable snapshot of the scheduler's queues and counters.

    Named as trio's ``statistics()`` methods are, across gosim.
    """
    return current_runtime().stats.snapshot()


def schedtrace(interval: float | None, file: IO[str] | None = None) -> None:
    """Print Go's ``SCHED ...`` line every ``interval`` seconds (None or 0 stops it).

    Like ``GODEBUG=schedtrace``: printing never keeps the runtime alive or hides a
    deadlock. Lines go to ``file`` (default stderr).
    """
    rt = current_runtime()
    stats = rt.stats
    if not interval:
        stats.schedtrace_interval = 0.0
        stats.schedtrace_next = math.inf
        return
    if interval < 0:
        raise ValueError(f"schedtrace: interval must be positive, got {interval}")
    stats.schedtrace_interval = interval
    stats.schedtrace_file = file
    stats.schedtrace_next = rt.now()
    stats.maybe_schedtrace(stats.schedtrace_next)


async def preempt_point() -> None:
    """Yield if the running goroutine has used up its time slice (cooperative preemption).

    Checks the clock (or, deterministic, the operation count) on every call: call it
    from long computations between gosim operations, not in the tightest loops.
    """
    rt = _state.rt
    if rt is not None and rt.preempt_check():
        await _trap(PREEMPT)
