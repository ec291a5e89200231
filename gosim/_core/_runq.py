"""Run queues: Ps, Go's ``runqput``/``runqget``/``runqsteal``, ``goready``, ``newproc``
and the dead-G free lists (``gfget``/``gfput``, ``goexit0``).

A P's ``runnext`` slot holds the G to run next (a woken partner, a new goroutine); its
local queue holds up to ``RUNQ_SIZE`` more; beyond that half of it spills to the global
queue (``runqputslow``). Everything that makes a G runnable on the current P goes
through the one :meth:`RunQueues.runqput`: ``goready`` (a wake), ``newproc`` (``go``).
Its C twin is ``runqput`` in ``gosim/_speedups.c``, which ``goready`` and ``go`` there
call; they spill through this class's ``runqput``.

Under ``GOSIM_DEBUG=1`` ``runqput`` throws on a G that is not runnable and ``goready``
on one that is not waiting, as Go's do.

Mirrors Go's ``proc.go`` (``runqput``, ``runqputslow``, ``globrunqget``, ``runqsteal``,
``goready``, ``newproc``, ``gfget``/``gfput``, ``goexit0``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Coroutine
from types import CoroutineType as _CoroutineType
from typing import TYPE_CHECKING, Any, Final

import trio

from gosim._core import _g
from gosim._core._accel import speedups
from gosim._core._dump import describe_fn
from gosim._core._exceptions import throw
from gosim._core._g import DEAD, RUNNABLE, WAITING, G
from gosim._core._state import GFREE_LOCAL_MAX, RUNQ_SIZE, _CallBox
from gosim._core._timers import Timer, TimerHeap
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
        """What the hot paths read and write on a runtime (``RuntimeBase`` in C)."""

        curg: G | None
        curp: P
        trace: Trace | None
        allg: dict[int, G]
        call_boxes: dict[int, _CallBox]
        nswitch: int
        goidgen: int
        timerseq: int
        ntimers: int
        main_goexited: bool
        gfree: list[G]  # global dead-G list (Go's sched.gFree)

        if TYPE_CHECKING:
            # RuntimeBase._burst (gosim/_speedups.c); the pure-Python driver never calls it.
            def _burst(self, p: P, g: G | None, burst_end: int) -> tuple[int, G, Any]: ...

            # RuntimeBase's timer twins (Sysmon's _addtimer_py / _deltimer_py).
            def addtimer(self, t: Timer, when: float) -> None: ...

            def deltimer(self, t: Timer) -> bool: ...

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


class RunQueues(_RuntimeFields):
    """The run queues of one runtime: its Ps, the global queue, the free Gs, allg.

    The base of the runtime's rooms (``_sysmon``, ``_syscall``, ``_schedule``,
    ``_runtime``), each a subclass adding what it owns; each sets its fields in
    ``_init_room``, which ``__init__`` calls once the run queues exist.
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
        self.injectq: list[G] = []  # Gs readied from trio tasks, drained by the driver
        # While the driver idles in trio: the cancel scope that anything readying a G
        # from outside (inject, shutdown) cancels to wake it.
        self.idle_scope: trio.CancelScope | None = None
        # Goroutines whose outcome a caller awaits (main under run, rt.call), by goid.
        self.call_boxes: dict[int, _CallBox] = {}
        self.main_goexited = False
        self.nswitch = 0
        self.nsteals = 0
        self.nstolen = 0
        self.max_threads = max_threads
        self._init_room()

    def _init_room(self) -> None:
        """Each room (subclass) sets its own fields here, after calling super's."""

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

    def runqget(self, p: P) -> G | None:
        """Go's ``runqget``: p's ``runnext``, else the head of its local queue, else None.

        The driver's hot loop (``Scheduler._schedule``, ``_python_burst``, the C
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

        _globready_unchecked = globready

        def globready(self, g: G, param: Any) -> None:
            if g.status != WAITING:
                raise throw(f"globready: goroutine {g.goid} is {_g.STATUS_NAMES[g.status]}")
            self._globready_unchecked(g, param)

    def can_spin(self, iteration: int) -> bool:
        """Go's ``sync_runtime_canSpin``: may a lock spin (yield) once more before parking?

        Only when it can pay off: fewer than ``ACTIVE_SPIN`` spins so far, more than one
        P, other Ps running, and nothing queued on the caller's own P.
        """
        if iteration >= ACTIVE_SPIN or len(self.allp) <= 1:
            return False
        p = self.curp
        if p.runnext is not None or p.runq:
            return False
        # "Other Ps running": with one driver thread, another P runs when it has work of
        # its own or can take some from the global queue.
        return bool(self.globrunq) or any(q is not p and q.has_work() for q in self.allp)

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
