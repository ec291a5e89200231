"""The runtime: Gs, Ps and the logical M that a single trio task drives; how to run one.

Glossary
--------
G  a goroutine (:mod:`._g`): a native coroutine plus its record.
P  a processor: the right to run Go code, with a local run queue (256 slots), a
   ``runnext`` slot, a timer heap and a cache of dead Gs. ``procs`` of them exist.
M  the thing that runs a P. Under the GIL the Ms that run Go code are logical: one trio
   task, the *driver*, interleaves the Ps round-robin on the trio thread. Blocking
   calls (:func:`syscall`) run on real OS threads from trio's thread pool.

The runtime's rooms
-------------------
One :class:`Runtime` is built up from a chain of classes, each in its own module and
each owning one part of the state:

``_state``     the per-thread ``_state.rt``, the traps a goroutine yields, the sizes the
               C accelerator is configured with;
``_runq``      Ps and run queues: ``runqput`` (the one way onto a P), ``goready``,
               ``newproc``, the free Gs and ``goexit0`` (class ``RunQueues``);
``_sysmon``    timers, preemption, statistics, schedtrace, procresize (``Sysmon``);
``_syscall``   syscalls on threads and trio calls (``Syscalls``);
``_schedule``  the driver: schedule/findrunnable, idling, exits, panics, deadlock
               (``Scheduler``);
``_runtime``   this module: ``Runtime``, ``run``, ``open_runtime`` and its handle, and
               the goroutine-facing functions (``go``, ``gosched``, ``statistics``...).

``_dump`` words crash output as Go does. Upper layers (channels, select, time, sync,
net) reach all this through :mod:`gosim.lowlevel` only.

Deterministic mode (``seed=``): the P rotation, steal victims and select choices come
from one seeded ``random.Random``, syscalls and trio calls run inline on the driver,
time is virtual (trio's ``MockClock``), so the same program takes the same schedule and
writes the same trace bytes on every run.

Mirrors Go's ``proc.go`` (``newproc``, ``gosched``, ``goexit``, ``GOMAXPROCS``) and
the program start of ``runtime.main``.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

import trio

from gosim._core._accel import speedups
from gosim._core._dump import describe_fn
from gosim._core._exceptions import NotInRuntime
from gosim._core._g import RUNNABLE
from gosim._core._runq import DEFAULT_MAX_THREADS
from gosim._core._schedule import Scheduler
from gosim._core._state import GOSCHED, PREEMPT, _CallBox, _Goexit, _state, _trap, current_runtime
from gosim._core._sysmon import SchedStatistics
from gosim._core._trace import Trace

T = TypeVar("T")

GC_YOUNG_THRESHOLD: Final = 10_000  # run() paces CPython's young GC like this (see run)


class Runtime(Scheduler):
    """One scheduler instance: its Ps, global queue, timers, counters and driver task.

    Made by :func:`open_runtime` (and :func:`gosim.run`); user code reaches it through
    the module functions (``go``, ``statistics``...) or through ``rt.call`` from trio.
    """

    def _init_room(self) -> None:
        super()._init_room()
        self.heap: Any = None  # a gosim.mem.Heap once gosim.malloc is first used
        # Per-runtime state of layers above the core (the simulated network, say),
        # keyed by the layer's module name.
        self.extensions: dict[str, Any] = {}


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
        if clock is not None:
            rt.virtual_jump = clock.jump
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


def statistics() -> SchedStatistics:
    """An immutable snapshot of the scheduler's queues and counters.

    Named as trio's ``statistics()`` methods are, across gosim.
    """
    return current_runtime().statistics()


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


async def preempt_point() -> None:
    """Yield if the running goroutine has used up its time slice (cooperative preemption).

    Checks the clock (or, deterministic, the operation count) on every call: call it
    from long computations between gosim operations, not in the tightest loops.
    """
    rt = _state.rt
    if rt is not None and rt.preempt_check():
        await _trap(PREEMPT)
