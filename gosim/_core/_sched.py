"""The goroutine scheduler: Gs, Ps and the logical M that a single trio task drives.

Glossary
--------
G  a goroutine (:mod:`._g`): a native coroutine plus its record.
P  a processor: the right to run Go code, with a local run queue (256 slots), a
   ``runnext`` slot, a timer heap and a cache of dead Gs. ``procs`` of them exist.
M  the thing that runs a P. Under the GIL the Ms that run Go code are logical: one trio
   task, the *driver*, interleaves the Ps round-robin on the trio thread. Blocking
   calls (:func:`syscall`) run on real OS threads from trio's thread pool.

How a goroutine runs, fast to slow
----------------------------------
1. A channel operation that can complete does so inside the goroutine's own coroutine:
   no yield to the driver, no allocation beyond the value (``gosim._chan``).
2. One that cannot parks: the coroutine yields the ``PARK`` trap to the driver, which
   marks the G waiting. Whoever completes the operation later calls :func:`goready`,
   which puts the G in the current P's ``runnext`` (the previous ``runnext`` is kicked
   to the local queue tail), so a woken partner runs next, as in Go.
3. The driver's loop is Go's ``schedule``: take the next P in turn, find a G for it
   (``findrunnable``: every 61st tick the global queue first, then ``runnext``, the
   local queue, expired timers, the global queue, goroutines readied from outside, then
   stealing half of a random victim's local queue for a few rounds; never its
   ``runnext``, which the victim runs on its next turn, see ``findrunnable``) and step
   it with ``coro.send`` until it traps.
4. When no P finds work the driver idles in trio until the earliest timer, a syscall's
   or trio call's completion, or a new ``rt.call``. If none of those can ever come, it
   stops with Go's deadlock error and a goroutine dump.
5. Every few hundred steps the driver checks timers and, at least every millisecond of
   real time, yields to trio (one checkpoint costs about 4 µs), so I/O and other trio
   tasks make progress under load.

Preemption is cooperative, as in Go before 1.14: gosim operations that complete at once
count down a small budget; when it runs out, the runtime checks whether the running G
has held its P for longer than the 10 ms slice (deterministic mode counts operations
instead of reading a clock) and, if so, the operation yields and the G goes to the
global queue. A goroutine that computes without calling gosim is never preempted.

Deterministic mode (``seed=``): the P rotation, steal victims and select choices come
from one seeded ``random.Random``, syscalls and trio calls run inline on the driver,
time is virtual (trio's ``MockClock``), so the same program takes the same schedule and
writes the same trace bytes on every run.

The C accelerator (``gosim/_speedups.c``, optional) has twins of the hot parts: the
G, P and runtime fields as C structs these classes subclass, ``go``, ``goready``,
``goexit0`` and the inner loop of step 3 (``RuntimeBase._burst``, used when no trace is
recorded; ``_python_burst`` is the Python one). Both take the same schedule for a seed.

Alternatives rejected: a trio task per goroutine (a trio wake-up costs ~4 µs, twenty
coroutine steps); in pure Python, a custom awaitable class for the fast path (slower
than a finished C future or a generator; in C, an awaitable with ``am_send`` is the
fastest of all and is what the accelerator uses); checking the clock on every switch
(~60 ns each) where a countdown does.

Mirrors Go's ``proc.go`` (``newproc``, ``goready``, ``runqput``, ``runqputslow``,
``runqget``, ``globrunqget``, ``runqsteal``, ``findRunnable``, ``schedule``, ``execute``,
``goexit0``, ``gfput``/``gfget``, ``entersyscall``/``exitsyscall``, ``handoffp``,
``procresize``, ``schedtrace``, ``checkdead``).
"""

from __future__ import annotations

import gc
import inspect
import math
import os
import random
import sys
import threading
import time
import types
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import CoroutineType as _CoroutineType
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

import outcome
import trio

from gosim._core import _exceptions, _g
from gosim._core._accel import speedups
from gosim._core._exceptions import Deadlock, FatalError, GosimError, NotInRuntime, Panic, throw
from gosim._core._g import DEAD, RUNNABLE, RUNNING, SYSCALL, WAITING, G
from gosim._core._netpoll import NetPoller
from gosim._core._timers import Timer, TimerHeap
from gosim._core._trace import Trace

T = TypeVar("T")

RUNQ_SIZE: Final = 256  # Go's len(p.runq)
FAIRNESS_TICKS: Final = 61  # schedule checks the global queue first every 61st tick
STEAL_ROUNDS: Final = 4  # Go's stealTries
TIME_SLICE: Final = 0.010  # forcePreemptNS: 10 ms
OP_BUDGET: Final = 128  # fast operations between two preemption checks
DET_SLICE_OPS: Final = 10_000  # deterministic mode: operations that make one slice
GFREE_LOCAL_MAX: Final = 64  # gfput moves a batch to the global list beyond this
PERIODIC_MASK: Final = 255  # timers and trio are checked every 256 switches
TRIO_YIELD_INTERVAL: Final = 0.001  # yield to trio at least this often under load
DEFAULT_MAX_THREADS: Final = 10_000  # Go's default limit on threads (debug.SetMaxThreads)
GC_YOUNG_THRESHOLD: Final = 10_000  # run() paces CPython's young GC like this (see run)

# What the C inner loop (RuntimeBase._burst) hands back to the driver.
_BURST_END: Final = 0
_BURST_TRAP: Final = 1
_BURST_EXIT: Final = 2

# Traps: what a goroutine's coroutine yields to the driver.
PARK: Final = "park"
GOSCHED: Final = "gosched"
PREEMPT: Final = "preempt"


class _SyscallTrap:
    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args


class _TrioCallTrap:
    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args


class _Goexit(BaseException):
    """Raised by :func:`goexit` to unwind the goroutine (Go's runtime.Goexit)."""


@types.coroutine
def _trap(what: Any) -> Generator[Any, Any, Any]:
    """Yield one trap to the driver; evaluate to the value the G is handed when resumed."""
    return (yield what)


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
        """What the hot paths read and write on a runtime (``RuntimeBase`` in C)."""

        curg: G | None
        curp: P
        trace: Trace | None
        allg: dict[int, G]
        call_boxes: dict[int, _CallBox]
        nswitch: int
        goidgen: int
        main_goexited: bool
        gfree: list[G]  # global dead-G list (Go's sched.gFree)

        if TYPE_CHECKING:
            # RuntimeBase._burst (gosim/_speedups.c); the pure-Python driver never calls it.
            def _burst(self, p: P, g: G | None, burst_end: int) -> tuple[int, G, Any]: ...

    _burst_available = False
else:
    _PFields = speedups.PBase
    _RuntimeFields = speedups.RuntimeBase
    _burst_available = True


class P(_PFields):
    """A processor. Fields are touched only by the driver and by code running on this P."""

    __slots__ = ()

    def __init__(self, pid: int) -> None:
        self.id = pid
        # Invariant: runnext is not also in runq; len(runq) <= RUNQ_SIZE.
        self.runnext = None
        self.runq = deque()
        self.schedtick = 0
        self.timers = TimerHeap()
        self.gfree = []  # dead Gs for reuse (Go's p.gFree)

    def has_work(self) -> bool:
        return self.runnext is not None or bool(self.runq)


@dataclass(frozen=True, slots=True)
class SchedStats:
    """An immutable snapshot of the scheduler, from :func:`gosim.stats`.

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


# The runtime whose driver is stepping a goroutine right now, or None while the driver
# is awaiting trio. Gosim operations read it to find the scheduler.
class _State(threading.local):
    """Per OS thread: the runtime whose driver is stepping goroutines on this thread.

    Invariant: ``rt`` is not None exactly while a driver on this thread is inside its
    stepping loop (None while it awaits trio). Thread-local so that runtimes in several
    threads (each its own trio.run) never see each other's scheduler. The C accelerator
    keeps the same slot in C thread-local storage, where its channel code reads it.
    """

    rt: Runtime | None = None


_state: _State = _State() if speedups is None else speedups.State()
if speedups is not None:
    speedups.configure(
        park=PARK,
        preempt=PREEMPT,
        send_on_closed=_exceptions.SendOnClosedChannel,
        close_of_closed=_exceptions.CloseOfClosedChannel,
        not_in_runtime=NotInRuntime,
        wait_recv=_g.WAIT_CHAN_RECEIVE,
        wait_send=_g.WAIT_CHAN_SEND,
        op_budget=OP_BUDGET,
        g_class=G,
        runq_size=RUNQ_SIZE,
        gfree_local_max=GFREE_LOCAL_MAX,
        periodic_mask=PERIODIC_MASK,
        transitions=_g.TRANSITIONS,
        internal_error=_exceptions.RuntimeInternalError,
        debug=_g.DEBUG,
    )


def current_runtime() -> Runtime:
    """The runtime running the calling goroutine; :class:`NotInRuntime` outside one."""
    rt = _state.rt
    if rt is None:
        raise NotInRuntime("not inside a gosim goroutine")
    return rt


def _describe_fn(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def _coro_funcname(coro: Any) -> str:
    """The function a coroutine runs, as dumps print it (``module.qualname``)."""
    code = getattr(coro, "cr_code", None)
    if code is None:
        return "?"
    frame = getattr(coro, "cr_frame", None)
    if frame is not None:
        module = frame.f_globals.get("__name__")
    else:  # finished: no frame, so find the module by the code's file
        found = inspect.getmodule(code)
        module = found.__name__ if found is not None else None
    return f"{module}.{code.co_qualname}" if module else str(code.co_qualname)


def _g_funcname(g: G) -> str:
    """The function a goroutine runs, as dumps print it (``module.qualname``)."""
    if g.fn is not None:
        return _describe_fn(g.fn)
    return _coro_funcname(g.coro)


def _created_by(g: G) -> str | None:
    """Go's ``created by F in goroutine N`` line, F the function that ran ``go``."""
    if not g.parent:
        return None
    return f"created by {_coro_funcname(g.creator)} in goroutine {g.parent}"


def _panic_line(exc: BaseException) -> str:
    """The first line of Go's crash report for exc: ``fatal error: ...`` for a throw,
    else ``panic: `` and the value's message (Go prints an error's ``Error()``), the
    type's name when the message is empty."""
    if isinstance(exc, FatalError):
        return str(exc)
    return f"panic: {str(exc) or type(exc).__name__}"


class _CallBox:
    """Where a goroutine started by ``run`` or ``rt.call`` leaves its outcome.

    The goroutine runs the caller's coroutine itself (no wrapper frame on every
    resume); the driver delivers the return value or exception here on exit.
    """

    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.result: outcome.Outcome[Any] | None = None
        self.done = trio.Event()

    def deliver(self, result: outcome.Outcome[Any]) -> None:
        self.result = result
        self.done.set()


class Runtime(_RuntimeFields):
    """One scheduler instance: its Ps, global queue, timers, counters and driver task.

    Made by :func:`open_runtime` (and :func:`gosim.run`); user code reaches it through
    the module functions (``go``, ``stats``...) or through ``rt.call`` from trio.
    """

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
        self.allp: list[P] = [P(i) for i in range(procs)]
        self.globrunq: deque[G] = deque()
        self.gfree: list[G] = []  # global dead-G list (Go's sched.gFree)
        self.allg: dict[int, G] = {}  # live goroutines by goid (Go's allgs)
        self.goidgen = 0
        self.curg: G | None = None
        self.curp: P = self.allp[0]
        self.check_switch = -1
        self.check_time = 0.0
        self.check_ops = 0
        self.inline_call: tuple[G, P, _TrioCallTrap] | None = None
        self.injectq: list[G] = []  # Gs readied from trio tasks, drained by the driver
        # While the driver idles in trio: the cancel scope that anything readying a G
        # from outside (inject, shutdown) cancels to wake it.
        self.idle_scope: trio.CancelScope | None = None
        self.netpoller: NetPoller | None = None
        self.timerseq = 0
        self.ntimers = 0  # live (armed) timers over all Ps: wake sources
        self.nexternal = 0  # syscalls and trio calls in flight: wake sources
        self.nthreads_busy = 0
        self.stopped = False
        self.failure: BaseException | None = None
        self.main_g: G | None = None
        self.main_goexited = False
        # Goroutines whose outcome a caller awaits (main under run, rt.call), by goid.
        self.call_boxes: dict[int, _CallBox] = {}
        self.open_mode = True  # False under gosim.run: main's return ends the runtime
        self.nursery: trio.Nursery | None = None
        self.heap: Any = None  # a gosim.mem.Heap once gosim.malloc is first used
        # Per-runtime state of layers above the core (the simulated network, say),
        # keyed by the layer's module name.
        self.extensions: dict[str, Any] = {}
        self.thread_limiter = trio.CapacityLimiter(max_threads)
        self.start_time = 0.0
        self._clock_now: Callable[[], float] = time.perf_counter
        self.last_trio_yield = 0.0
        self.schedtrace_interval = 0.0
        self.schedtrace_next = math.inf
        self.schedtrace_file: IO[str] | None = None
        # Counters (see SchedStats).
        self.nswitch = 0
        self.nsteals = 0
        self.nstolen = 0
        self.nhandoffs = 0
        self.npreempt = 0
        self.nsyscalls = 0
        self.ntriocalls = 0
        self.ntimersfired = 0

    # ----------------------------------------------------------------- clock

    def now(self) -> float:
        """The runtime's clock (trio's clock: virtual under ``virtual_time``), seconds."""
        return self._clock_now()

    # ------------------------------------------------------------ run queues

    def runqput(self, p: P, g: G, next_: bool) -> None:
        """Put g on p's local queue (``runnext`` when ``next_``). Executed only for the current P.

        A kicked-out ``runnext`` goes to the tail; a full queue moves half of itself and g
        to the global queue (``runqputslow``). The one copy in Python of Go's ``runqput``:
        ``goready`` and ``newproc`` put through it; ``runqput`` in ``gosim/_speedups.c``
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
            return
        # runqputslow: move half of the local queue, then g, to the global queue.
        half = len(q) // 2
        popleft = q.popleft
        batch = [popleft() for _ in range(half)]
        batch.append(g)
        self.globrunq.extend(batch)

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
            self.nsteals += 1
            self.nstolen += 1
            if self.trace is not None:
                self.trace.emit(self, "steal", thief.id, g.goid, victim.id, 1)
            return g
        stolen = [vq.popleft() for _ in range(n)]
        self.nsteals += 1
        self.nstolen += n
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

    if _g.DEBUG and not TYPE_CHECKING:
        # GOSIM_DEBUG: the preconditions Go throws on, checked around the one runqput
        # and goready (the C twins check the same in C).
        _runqput_unchecked = runqput

        def runqput(self, p: P, g: G, next_: bool) -> None:
            if g.status != RUNNABLE:
                raise throw(f"runqput: goroutine {g.goid} is {_g.STATUS_NAMES[g.status]}")
            self._runqput_unchecked(p, g, next_)

        _goready_unchecked = goready

        def goready(self, g: G, param: Any) -> None:
            if g.status != WAITING:
                raise throw(f"goready: goroutine {g.goid} is {_g.STATUS_NAMES[g.status]}")
            self._goready_unchecked(g, param)

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
        for g in q:
            if g.status != RUNNABLE:  # rt.call's new G is runnable already
                g.status = RUNNABLE
            old = g.p
            if old is not None and old in self.allp and not old.has_work():
                old.runnext = g
            else:
                self.globrunq.append(g)

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
        ``gosim/_speedups.c`` is the C twin of ``go`` and this function.
        """
        if coro is None:
            coro = fn(*args)
        if type(coro) is not _CoroutineType and not isinstance(coro, Coroutine):
            if hasattr(coro, "close"):
                coro.close()
            raise TypeError(
                f"go: {_describe_fn(fn)} must be an async function (returning a coroutine), "
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
        ``gosim/_speedups.c`` is the C twin.
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

    # ---------------------------------------------------------------- timers

    def addtimer(self, t: Timer, when: float) -> None:
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

    def deltimer(self, t: Timer) -> bool:
        """Disarm t; True when it was armed (it had not fired and was not stopped)."""
        if t.p is None or not t.armed:
            return False
        t.p.timers.discard(t)
        self.ntimers -= 1
        return True

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

    def stats(self) -> SchedStats:
        local = tuple(len(p.runq) + (p.runnext is not None) for p in self.allp)
        idle = sum(1 for n in local if n == 0)
        if self.curg is not None and idle:
            idle -= 1  # the P running the caller is not idle
        return SchedStats(
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
        s = self.stats()
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

    # ------------------------------------------------------------ the driver

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.stopped = True

    def findrunnable(self, p: P) -> G | None:
        """The slow half of Go's findRunnable, after runnext and the local queue are empty."""
        if self.ntimers:
            now = self._clock_now()
            if p.timers.earliest() <= now:
                self.checktimers(now)
                np_ = self.netpoller
                if np_ is not None and np_.waiters():
                    # I/O that arrived by now runs before the timers' goroutines, so a
                    # deadline never fires on data that is already waiting to be read.
                    self._netpoll_into(p, np_)
                g = p.runnext
                if g is not None:
                    p.runnext = None
                    return g
                if p.runq:
                    return p.runq.popleft()
        if self.injectq:
            self._drain_inject()
            g = p.runnext
            if g is not None:
                p.runnext = None
                return g
        if self.globrunq:
            return self.globrunqget(p, 0)
        np_ = self.netpoller
        if np_ is not None and np_.waiters() and self._netpoll_into(p, np_):
            # netpoll readied goroutines into this P (runnext first), as Go's findRunnable.
            g = p.runnext
            if g is not None:
                p.runnext = None
                return g
            if p.runq:
                return p.runq.popleft()
        nump = len(self.allp)
        if nump > 1:
            rng = self.rng
            for _ in range(STEAL_ROUNDS):
                start = rng.randrange(nump)
                for i in range(nump):
                    victim = self.allp[(start + i) % nump]
                    if victim is p:
                        continue
                    # Go steals a victim's runnext in the last round because the
                    # victim's M may be stuck running a long G. Here every P gets its
                    # turn within one rotation, so its runnext is about to run anyway:
                    # stealing it would only move goroutines off their P (a woken
                    # partner, a G back from a syscall) for nothing.
                    g = self.runqsteal(p, victim, False)
                    if g is not None:
                        return g
        return None

    def _netpoll_into(self, p: P, np_: NetPoller) -> int:
        """Poll without blocking; readied goroutines land on p (Go's findRunnable)."""
        saved = self.curp
        self.curp = p
        try:
            return np_.poll()
        finally:
            self.curp = saved

    async def _idle(self) -> None:
        """No P found work: wait for a timer, an outside completion or a new call."""
        if self.injectq:
            return
        nxt = self.next_timer() if self.ntimers else math.inf
        np_ = self.netpoller
        io_waiters = np_.waiters() if np_ is not None else 0
        if (
            self.nexternal == 0
            and io_waiters == 0
            and (self.allg or not self.open_mode)
            and (nxt == math.inf or not any(p.timers.can_wake() for p in self.allp))
        ):
            # Nothing can wake a goroutine: no timer that can (channel timers nobody
            # receives from cannot, as in Go 1.23), no I/O, no syscall, no trio call.
            self._checkdead()
            return
        now = self._clock_now()
        if nxt <= now:
            self.checktimers(now)
            return
        deadline = min(nxt, self.schedtrace_next)
        _state.rt = None
        try:
            with trio.move_on_at(deadline) as scope:
                self.idle_scope = scope
                if self.stopped:
                    scope.cancel()
                if np_ is not None and io_waiters:
                    await trio.lowlevel.wait_readable(np_.fileno())
                else:
                    await trio.sleep_forever()
        finally:
            _state.rt = self
            self.idle_scope = None
        if np_ is not None and io_waiters:
            np_.poll()
        self.last_trio_yield = self._clock_now()
        if self.schedtrace_interval:
            self._maybe_schedtrace(self.last_trio_yield)

    def _checkdead(self) -> None:
        """Nothing can ever run again: Go's checkdead."""
        if not self.allg and self.main_goexited:
            self._fail(Deadlock("no goroutines (main called runtime.Goexit) - deadlock!", ""))
            return
        dump = self.goroutine_dump()
        self._fail(Deadlock("all goroutines are asleep - deadlock!\n\n" + dump, dump))

    def goroutine_dump(self) -> str:
        """Go's crash-dump listing: one stanza per goroutine with its state."""
        lines = []
        for goid in sorted(self.allg):
            g = self.allg[goid]
            waiting = g.status == WAITING
            state = (g.waitreason or "waiting") if waiting else _g.STATUS_NAMES[g.status]
            lines.append(f"goroutine {goid} [{state}]:")
            lines.append(f"{_g_funcname(g)}(...)")
            created_by = _created_by(g)
            if created_by is not None:
                lines.append(created_by)
            lines.append("")
        return "\n".join(lines)

    async def _periodic(self) -> None:
        """Every PERIODIC_MASK+1 switches: timers, outside completions, a trio yield."""
        now = self._clock_now()
        np_ = self.netpoller
        if np_ is not None and np_.waiters():
            # sysmon's netpoll: I/O is not starved by busy goroutines. Before the timers,
            # for the same reason as in findrunnable.
            np_.poll()
        if self.ntimers:
            self.checktimers(now)
        if self.injectq:
            self._drain_inject()
        if self.schedtrace_interval:
            self._maybe_schedtrace(now)
        if now - self.last_trio_yield >= TRIO_YIELD_INTERVAL or (self.nswitch & 0xFFF) == 0:
            _state.rt = None
            try:
                await trio.lowlevel.checkpoint()
            finally:
                _state.rt = self
            self.last_trio_yield = self._clock_now()

    async def drive(self) -> None:
        """The driver task: Go's schedule loop over all Ps until the runtime stops."""
        clock = trio.lowlevel.current_clock()
        self._clock_now = clock.current_time
        self.start_time = self.last_trio_yield = clock.current_time()
        if self.schedtrace_interval:
            self.schedtrace_next = self.start_time + self.schedtrace_interval
        prev = _state.rt
        _state.rt = self
        try:
            await self._schedule()
        finally:
            _state.rt = prev
            self.curg = None

    async def _schedule(self) -> None:
        """Go's schedule loop. Each turn takes the next P and runs a burst of its Gs.

        With one P a burst ends after FAIRNESS_TICKS switches (so the global queue is
        looked at first every 61 ticks, as in Go), when the P runs dry, or when periodic
        duties are due: the hot loop stays tight. With several Ps a burst is one switch,
        round-robin over the Ps (seeded start when deterministic).
        """
        allp = self.allp
        pidx = self.rng.randrange(len(allp)) if self.deterministic else 0
        idle_run = 0
        trace = self.trace
        # The C inner loop, when built; it records no trace events, so a traced run
        # takes the Python loop.
        burst = self._burst if _burst_available and trace is None else None
        while not self.stopped:
            nump = len(allp)
            if pidx >= nump:
                pidx = 0
            p = allp[pidx]
            pidx += 1
            g: G | None = None
            if p.schedtick >= FAIRNESS_TICKS:
                p.schedtick = 0
                if self.globrunq:
                    g = self.globrunqget(p, 1)
            if g is None:
                g = p.runnext
                if g is not None:
                    p.runnext = None
                elif p.runq:
                    g = p.runq.popleft()
                else:
                    g = self.findrunnable(p)
                    if g is None:
                        idle_run += 1
                        if idle_run >= nump:
                            idle_run = 0
                            await self._idle()
                        continue
            idle_run = 0
            self.curp = p
            nsw = self.nswitch
            # One P alone runs bursts of up to 61 switches. With several Ps each runs one
            # switch per turn, so they advance together as Go's Ps do in parallel (a G
            # readied or created on one P never waits a whole burst of another).
            burst_start = nsw
            burst_end = nsw + (FAIRNESS_TICKS - p.schedtick if nump == 1 else 1)
            # The hot loop: execute g, then the next G of this P, until the burst ends.
            if burst is not None:
                # The same loop in C (gosim._speedups), which hands back what it does
                # not handle itself: traps other than PARK, awaited exits, errors. Given
                # None for g, it takes p's next G unless the burst is over.
                gnext: G | None = g
                while True:
                    code, g, payload = burst(p, gnext, burst_end)
                    gnext = None
                    if code == _BURST_END:
                        break
                    if code == _BURST_TRAP:
                        if self._trap_slow(g, p, payload):
                            break
                    elif code == _BURST_EXIT:
                        if self._exited(g, payload):
                            break
                    elif isinstance(payload, _Goexit):
                        if self._goexited(g, p):
                            break
                    elif isinstance(payload, Exception):
                        if not self._raised(g, p, payload):
                            return
                    else:
                        self.curg = None
                        self._fail(payload)
                        return
                nsw = self.nswitch
            else:
                nsw = self._python_burst(p, g, burst_end)
                if nsw < 0:
                    return
            self.curg = None
            p.schedtick += nsw - burst_start
            if self.inline_call is not None:
                await self._run_inline_call()
            if not (nsw & PERIODIC_MASK):
                await self._periodic()

    def _python_burst(self, p: P, g: G, burst_end: int) -> int:
        """The driver's inner loop: execute g, then the next G of p, until the burst
        ends. Returns the switch count, or -1 when the runtime stopped for good (a panic,
        a fatal error). ``RuntimeBase._burst`` is its C twin: keep the two in step.
        """
        # Invariant: self.curg is g while g's coroutine runs; None outside this loop.
        trace = self.trace
        runq = p.runq
        nsw = self.nswitch
        while True:
            self.curg = g
            g.status = RUNNING
            nsw += 1
            self.nswitch = nsw
            if trace is not None:
                trace.emit(self, "run", p.id, g.goid, 0, 0)
            try:
                trap = g.coro.send(g.param)
            except StopIteration as stop:
                self.goexit0(g, p)
                if (self.main_goexited or g.goid in self.call_boxes) and self._exited(
                    g, stop.value
                ):
                    break
            except _Goexit:
                if self._goexited(g, p):
                    break
            except Exception as exc:
                if not self._raised(g, p, exc):
                    return -1
            except BaseException as exc:
                self.curg = None
                self._fail(exc)
                return -1
            else:
                if trap is PARK:
                    g.status = WAITING
                    if trace is not None:
                        trace.emit(self, "park", p.id, g.goid, 0, 0)
                elif self._trap_slow(g, p, trap):
                    break
            if nsw >= burst_end or not (nsw & PERIODIC_MASK):
                break
            nxt = p.runnext
            if nxt is not None:
                p.runnext = None
                g = nxt
            elif runq:
                g = runq.popleft()
            else:
                break
        return nsw

    def _exited(self, g: G, value: Any) -> bool:
        """After goexit0 of a goroutine with a caller waiting for its result (main,
        ``rt.call``), or of anyone once main called goexit; True if the runtime stopped."""
        box = self.call_boxes.pop(g.goid, None)
        if box is not None:
            box.deliver(outcome.Value(value))
        if g is self.main_g and not self.open_mode:
            self.stopped = True
        elif self.main_goexited and not self.allg:
            self._checkdead()
        return self.stopped

    def _goexited(self, g: G, p: P) -> bool:
        """g called goexit (True if that stopped the runtime).

        From main under ``run``, the program goes on without main.
        """
        box = self.call_boxes.get(g.goid)
        if box is not None and (self.open_mode or g is not self.main_g):
            del self.call_boxes[g.goid]
            box.deliver(outcome.Error(GosimError("the called goroutine ended with goexit")))
        if g is self.main_g and not self.open_mode:
            self.main_goexited = True
            self.main_g = None
        self.goexit0(g, p)
        if self.main_goexited and not self.allg:
            self._checkdead()
        return self.stopped

    def _raised(self, g: G, p: P, exc: Exception) -> bool:
        """g raised exc: deliver it to an ``rt.call`` caller (True: the driver goes on)
        or panic, which stops the runtime (False)."""
        if g.goid in self.call_boxes and (self.open_mode or g is not self.main_g):
            # rt.call: the exception belongs to the trio caller, not a panic.
            self.call_boxes.pop(g.goid).deliver(outcome.Error(exc))
            self.goexit0(g, p)
            return True
        self.curg = None
        self._panic(g, exc)
        return False

    def _panic(self, g: G, exc: Exception) -> None:
        msg = f"{_panic_line(exc)}\n\ngoroutine {g.goid} [running]:\n{_g_funcname(g)}(...)"
        created_by = _created_by(g)
        if created_by is not None:
            msg += "\n" + created_by
        err = Panic(g.goid, msg)
        err.__cause__ = exc
        g.status = DEAD
        self.allg.pop(g.goid, None)
        g.coro = g.elem = g.param = g.p = None
        self._fail(err)

    def _trap_slow(self, g: G, p: P, trap: Any) -> bool:
        """Handle a trap other than PARK; True when it stopped the runtime."""
        if trap is GOSCHED or trap is PREEMPT:
            g.status = RUNNABLE
            g.param = None
            if trap is PREEMPT:
                self.npreempt += 1
            if self.trace is not None:
                self.trace.emit(
                    self, "preempt" if trap is PREEMPT else "gosched", p.id, g.goid, 0, 0
                )
            self.globrunq.append(g)
            return self.stopped
        if type(trap) is _SyscallTrap:
            self._entersyscall(g, p, trap)
            return self.stopped
        if type(trap) is _TrioCallTrap:
            self._start_trio_call(g, p, trap)
            return self.stopped
        # Something awaited a foreign awaitable (trio, asyncio) inside a goroutine.
        g.status = RUNNABLE
        g.param = None
        err = TypeError(
            f"goroutine {g.goid} awaited {trap!r}, which is not a gosim operation: "
            "call trio code with gosim.trio_call(fn, *args)"
        )
        try:
            g.coro.throw(err)
        except BaseException as exc:  # the goroutine did not handle it: a panic
            if isinstance(exc, StopIteration):
                self.goexit0(g, p)
                return self.stopped
            if isinstance(exc, Exception):
                self._panic(g, exc)
            else:
                self._fail(exc)
            return self.stopped
        # It caught the error and trapped again: treat like a gosched to keep it simple.
        self.globrunq.append(g)
        return self.stopped

    def _entersyscall(self, g: G, p: P, trap: _SyscallTrap) -> None:
        g.status = SYSCALL
        g.p = p  # exitsyscall (_drain_inject) hands g back to this P if it is idle then
        self.nsyscalls += 1
        if p.has_work() or self.globrunq:
            # handoffp: this P has work, so it goes to another M while g's M blocks.
            self.nhandoffs += 1
        if self.trace is not None:
            self.trace.emit(self, "syscall", p.id, g.goid, 0, 0)
        if self.deterministic:
            # Reproducible: the call runs inline and g takes its P back at once.
            res = outcome.capture(trap.fn, *trap.args)
            g.status = RUNNABLE
            g.param = res
            self.runqput(p, g, True)
            return
        self.nexternal += 1
        assert self.nursery is not None
        self.nursery.start_soon(self._run_syscall, g, trap.fn, trap.args)

    async def _run_syscall(self, g: G, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.nthreads_busy += 1
        try:
            res = await outcome.acapture(
                trio.to_thread.run_sync,
                fn,
                *args,
                limiter=self.thread_limiter,
                abandon_on_cancel=True,
            )
        finally:
            self.nthreads_busy -= 1
            self.nexternal -= 1
        self.inject(g, res)

    def _start_trio_call(self, g: G, p: P, trap: _TrioCallTrap) -> None:
        g.status = WAITING
        g.waitreason = _g.WAIT_TRIO_CALL
        g.p = p  # like a syscall: back to this P when it is idle
        self.ntriocalls += 1
        if self.deterministic:
            # Reproducible: the driver awaits the call itself before stepping anyone else.
            self.inline_call = (g, p, trap)
            return
        self.nexternal += 1
        assert self.nursery is not None
        self.nursery.start_soon(self._run_trio_call, g, trap.fn, trap.args)

    async def _run_inline_call(self) -> None:
        assert self.inline_call is not None
        g, p, trap = self.inline_call
        self.inline_call = None
        _state.rt = None
        try:
            res = await outcome.acapture(trap.fn, *trap.args)
        finally:
            _state.rt = self
        g.status = RUNNABLE
        g.param = res
        self.curp = p
        self.runqput(p, g, True)

    async def _run_trio_call(
        self, g: G, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        try:
            res = await outcome.acapture(fn, *args)
        finally:
            self.nexternal -= 1
        self.inject(g, res)

    # -------------------------------------------------------------- shutdown

    def close_all(self) -> None:
        """Close every live goroutine's coroutine so its ``finally`` blocks run."""
        prev = _state.rt
        _state.rt = None  # a finally block must not schedule work on a stopped runtime
        try:
            for goid in sorted(self.allg):
                g = self.allg[goid]
                coro = g.coro
                g.status = DEAD
                # Drop everything the G holds: with the C accelerator, G records are not
                # tracked by the cycle collector, so nothing may stay reachable from them.
                g.coro = g.elem = g.param = g.p = g.fn = None
                if coro is not None:
                    try:
                        coro.close()
                    except RuntimeError:
                        # The goroutine awaited gosim in a finally block while being
                        # closed ("coroutine ignored GeneratorExit"); nothing can run it.
                        pass
                    except Exception:
                        pass
            self.allg.clear()
            closer = getattr(self.netpoller, "close", None)
            if closer is not None:
                closer()  # sockets still open when the runtime ends are closed
        finally:
            _state.rt = prev


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
            rt.nursery = nursery
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
        raise TypeError(f"{_describe_fn(fn)} must be an async function, got {type(coro).__name__}")
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
        runtime; a panic elsewhere, or a deadlock, stops it and is raised here as
        :class:`Panic` / :class:`Deadlock`.
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
    ``finally`` blocks run). An exception escaping any goroutine stops the runtime and
    raises :class:`Panic`; when nothing can run, :class:`Deadlock`. ``procs`` defaults to
    the CPU count (Go's GOMAXPROCS). ``seed`` fixes every random choice; with
    ``virtual_time=True`` time is virtual too, and the run is fully reproducible.
    ``schedtrace`` prints Go's ``SCHED`` line to stderr every that many seconds.

    While it runs, CPython's young-generation GC threshold is raised to at least
    ``gc_young_threshold`` (restored afterwards; None leaves the GC alone). Goroutines
    are GC-tracked objects born in bulk, and the default threshold of 700 made the
    cyclic collector half the cost of spawning 100,000 of them (see BENCHMARKS.md);
    cycles are still collected, just in larger batches, as Go's GOGC paces its GC.
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
        if schedtrace:
            rt.schedtrace_interval = schedtrace
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
        try:
            async with trio.open_nursery() as nursery:
                rt.nursery = nursery
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
    go = speedups.go  # the same newproc in C (gosim/_speedups.c), same contract


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


def stats() -> SchedStats:
    """An immutable snapshot of the scheduler's queues and counters."""
    return current_runtime().stats()


def schedtrace(interval: float | None, file: IO[str] | None = None) -> None:
    """Print Go's ``SCHED ...`` line every ``interval`` seconds (None or 0 stops it).

    Like ``GODEBUG=schedtrace``: printing never keeps the runtime alive or hides a
    deadlock. Lines go to ``file`` (default stderr).
    """
    rt = current_runtime()
    if not interval:
        rt.schedtrace_interval = 0.0
        rt.schedtrace_next = math.inf
        return
    if interval < 0:
        raise ValueError(f"schedtrace: interval must be positive, got {interval}")
    rt.schedtrace_interval = interval
    rt.schedtrace_file = file
    rt.schedtrace_next = rt.now()
    rt._maybe_schedtrace(rt.schedtrace_next)


async def syscall(fn: Callable[..., T], *args: Any) -> T:
    """Run the blocking ``fn(*args)`` on an OS thread while other goroutines keep running.

    The goroutine enters the syscall state and its P is handed off; on return it
    re-acquires a P (its old one when idle) or waits in the global queue. Exceptions
    from ``fn`` are raised here. In deterministic mode the call runs inline.
    """
    if _state.rt is None:
        raise NotInRuntime("syscall: not inside a gosim goroutine")
    res = await _trap(_SyscallTrap(fn, args))
    return res.unwrap()  # type: ignore[no-any-return]


async def trio_call(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run the trio async function ``fn(*args)`` in the enclosing trio program; return its result.

    The goroutine parks (wait reason ``trio call``) while a trio task runs the call, so
    trio libraries can be used from goroutines. Exceptions are raised here.
    """
    if _state.rt is None:
        raise NotInRuntime("trio_call: not inside a gosim goroutine")
    res = await _trap(_TrioCallTrap(fn, args))
    return res.unwrap()  # type: ignore[no-any-return]


def now() -> float:
    """The runtime clock in seconds (monotonic; virtual under ``virtual_time=True``)."""
    return current_runtime().now()


async def preempt_point() -> None:
    """Yield if the running goroutine has used up its time slice (cooperative preemption).

    Checks the clock (or, deterministic, the operation count) on every call: call it
    from long computations between gosim operations, not in the tightest loops.
    """
    rt = _state.rt
    if rt is not None and rt.preempt_check():
        await _trap(PREEMPT)
