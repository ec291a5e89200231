"""Syscalls and trio calls: a goroutine's ways out of the scheduler and back.

``syscall(fn, ...)`` runs a blocking function on one of trio's worker threads (Go's
``entersyscall``/``exitsyscall``; the P is handed off when it has other work);
``trio_call(fn, ...)`` runs a trio async function in a task of the enclosing trio
program while the goroutine waits. Either comes back through ``inject``, which the
driver drains: the G prefers its old P if that is idle (``exitsyscall``), else the
global queue. In deterministic mode both run inline on the driver, so a seed gives the
same schedule. A runtime holds one :class:`Syscalls` (``rt.syscalls``): the calls in
flight, the thread limiter and the virtual clock's hold.

Another OS thread (a store's committer, say) wakes a goroutine through a
:class:`ThreadWake`: its settle is queued on the runtime (``from_threads``), and the
driver, if it is blocked, is woken the way it waits (the netpoller's ``wakeup``, Go's
``netpollBreak``, or trio's token); the driver settles the waiter itself when it next
looks for work. While a ThreadWake is outstanding it is a wake source, as a syscall is.

Virtual time without a seed: a syscall runs on a thread for real time, and trio's
``MockClock`` would jump ahead while the driver waits for it, firing timers "before" a
call that was still running. As Go's ``testing/synctest`` counts a goroutine in a
syscall as not durably blocked, the clock's autojump is held while any syscall runs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import outcome
import trio

from gosim._core import _g
from gosim._core._exceptions import NotInRuntime
from gosim._core._g import RUNNABLE, SYSCALL, WAITING, G
from gosim._core._state import _state, _trap

if TYPE_CHECKING:
    from gosim._core._runq import P
    from gosim._core._runtime import Runtime
    from gosim._core._wait import Waiter

T = TypeVar("T")

# Syscalls.idle_in: where the driver waits while it idles, so that another OS thread
# knows how to wake it (see Syscalls.from_thread).
NOT_IDLE: Final = 0
# Blocked in the netpoller's poll, or waiting in trio on its descriptor: its wakeup()
# breaks either (one eventfd write; trio's token would cost a round of trio's own).
IDLE_IN_NETPOLL: Final = 1
IDLE_IN_TRIO: Final = 2  # waiting in trio, not on the netpoller: trio's token runs rt.wake


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


class Syscalls:
    """The syscalls and trio calls of one runtime (``rt.syscalls``) and their threads.

    Invariant: ``nexternal`` counts the syscalls and trio calls in flight on trio tasks
    and ``thread_waits`` the :class:`ThreadWake` promises not yet taken by the driver
    (both wake sources besides timers and I/O); ``inline_call`` is the deterministic
    trio call the driver awaits after the current burst, if any.
    """

    __slots__ = (
        "clock_holds",
        "from_threads",
        "held_autojump",
        "idle_in",
        "inline_call",
        "nexternal",
        "nthreads_busy",
        "nursery",
        "rt",
        "thread_clock_holds",
        "thread_limiter",
        "thread_waits",
        "trio_token",
    )

    def __init__(self, rt: Runtime, max_threads: int) -> None:
        self.rt = rt
        self.inline_call: tuple[G, P, _TrioCallTrap] | None = None
        self.nexternal = 0  # syscalls and trio calls in flight: wake sources
        self.nthreads_busy = 0
        self.clock_holds = 0  # syscalls holding a virtual clock's autojump
        self.held_autojump = 0.0  # its threshold before the first of them
        self.thread_limiter = trio.CapacityLimiter(max_threads)
        #: The trio nursery the calls run in (the runtime's, set as it starts).
        self.nursery: trio.Nursery | None = None
        #: The trio run's token, set as the driver starts (a thread wakes it with it).
        self.trio_token: trio.lowlevel.TrioToken | None = None
        # ThreadWakes settled by other OS threads: appended by them, taken by the driver
        # (deque's append and popleft are atomic).
        self.from_threads: deque[ThreadWake] = deque()
        self.thread_waits = 0  # ThreadWakes made and not yet taken: wake sources
        self.thread_clock_holds = 0  # those of them that hold a virtual clock's autojump
        self.idle_in = NOT_IDLE  # where the driver waits, for from_thread

    # -------------------------------------------------------- other OS threads

    def from_thread(self, wake: ThreadWake) -> None:
        """Queue ``wake``'s settle for the driver and wake it if it idles; any thread.

        No lost wake-up: the driver sets ``idle_in`` before it looks at
        ``from_threads`` a last time and blocks, and this appends before it reads
        ``idle_in`` (each step atomic under the GIL), so either the driver sees the
        settle before it blocks or this sees the driver idle and wakes it. A wake that
        comes after the driver woke for another reason is harmless: it looks again."""
        self.from_threads.append(wake)
        idle_in = self.idle_in
        if idle_in == IDLE_IN_NETPOLL:
            netpoller = self.rt.netpoller
            assert netpoller is not None
            netpoller.wakeup()
        elif idle_in == IDLE_IN_TRIO:
            token = self.trio_token
            assert token is not None
            try:
                token.run_sync_soon(self.rt.wake)
            except trio.RunFinishedError:  # the runtime is gone: nobody waits
                pass

    def take_from_threads(self) -> None:
        """On the driver: settle every waiter handed over by another thread (each wakes
        onto ``rt.curp``, as after a ``goready``)."""
        queue = self.from_threads
        while queue:
            wake = queue.popleft()
            self.thread_waits -= 1
            if wake._held_clock:
                self.thread_clock_holds -= 1
                self._release_virtual_clock()
            wake._waiter.settle(wake._value)

    def end_thread_waits(self) -> None:
        """The runtime ended (on its trio thread): the ThreadWakes still outstanding will
        settle nothing, and the holds on a virtual clock's autojump they took are given
        back (the clock may be the enclosing trio program's, which goes on)."""
        while self.thread_clock_holds:
            self.thread_clock_holds -= 1
            self._release_virtual_clock()

    def enter(self, g: G, p: P, trap: _SyscallTrap) -> None:
        """Go's ``entersyscall``: run the trap's call on a thread; g waits for it."""
        rt = self.rt
        stats = rt.stats
        g.status = SYSCALL
        g.p = p  # exitsyscall (_drain_inject) hands g back to this P if it is idle then
        stats.nsyscalls += 1
        if p.has_work() or rt.globrunq:
            # handoffp: this P has work, so it goes to another M while g's M blocks.
            stats.nhandoffs += 1
        if rt.trace is not None:
            rt.trace.emit(rt, "syscall", p.id, g.goid, 0, 0)
        if rt.deterministic:
            # Reproducible: the call runs inline and g takes its P back at once.
            res = outcome.capture(trap.fn, *trap.args)
            g.status = RUNNABLE
            g.param = res
            rt.runqput(p, g, True)
            return
        self.nexternal += 1
        assert self.nursery is not None
        self.nursery.start_soon(self._run_syscall, g, trap.fn, trap.args)

    async def _run_syscall(self, g: G, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.nthreads_busy += 1
        held = self._hold_virtual_clock()
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
            if held:
                self._release_virtual_clock()
        self.rt.inject(g, res)

    def _hold_virtual_clock(self) -> bool:
        """Stop a virtual clock's autojump while this syscall runs (see the module
        docstring); False when the clock is real (nothing to hold)."""
        if self.clock_holds == 0:
            clock: Any = trio.lowlevel.current_clock()
            threshold = getattr(clock, "autojump_threshold", None)  # trio's MockClock
            if threshold is None or threshold == math.inf:
                return False
            self.held_autojump = threshold
            clock.autojump_threshold = math.inf
        self.clock_holds += 1
        return True

    def _release_virtual_clock(self) -> None:
        self.clock_holds -= 1
        if self.clock_holds == 0:
            clock: Any = trio.lowlevel.current_clock()
            clock.autojump_threshold = self.held_autojump

    def start_trio_call(self, g: G, p: P, trap: _TrioCallTrap) -> None:
        """Run the trap's trio call in a task of the runtime's nursery; g waits for it."""
        rt = self.rt
        g.status = WAITING
        g.waitreason = _g.WAIT_TRIO_CALL
        g.p = p  # like a syscall: back to this P when it is idle
        rt.stats.ntriocalls += 1
        if rt.deterministic:
            # Reproducible: the driver awaits the call itself before stepping anyone else.
            self.inline_call = (g, p, trap)
            return
        self.nexternal += 1
        assert self.nursery is not None
        self.nursery.start_soon(self._run_trio_call, g, trap.fn, trap.args)

    async def run_inline_call(self) -> None:
        """Await the deterministic trio call (``inline_call``) on the driver itself."""
        assert self.inline_call is not None
        rt = self.rt
        g, p, trap = self.inline_call
        self.inline_call = None
        _state.rt = None
        try:
            res = await outcome.acapture(trap.fn, *trap.args)
        finally:
            _state.rt = rt
        g.status = RUNNABLE
        g.param = res
        rt.curp = p
        if p.idle:  # it went idle while the call ran: g takes it back
            rt.acquire_idle(p)
        rt.runqput(p, g, True)

    async def _run_trio_call(
        self, g: G, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        try:
            res = await outcome.acapture(fn, *args)
        finally:
            self.nexternal -= 1
        self.rt.inject(g, res)


class ThreadWake:
    """Another OS thread's one settle of a :class:`~gosim._core._wait.Waiter`.

    Made inside a runtime (by the goroutine that hands work to a thread of its own,
    before it waits), for one waiter of that runtime. From then until the driver has
    taken the settle, the runtime counts it as a wake source: it reports no deadlock
    while every goroutine waits for the thread, and a virtual clock does not jump
    meanwhile. :meth:`settle` may be called from any thread, once; it never blocks.
    The driver settles the waiter itself (``Waiter.settle(value)``, so every guarantee
    of a settle on the runtime's thread holds) the next time it looks for work:
    between two goroutines, or at once if it idles (a blocked driver is woken). A
    settle after the runtime ended does nothing. On a virtual clock the clock's autojump
    is held meanwhile, as for a syscall (the thread takes real time the clock must not
    skip); a reproducible runtime should not wait on a thread's timing at all
    (``lowlevel.reproducible``).

    What it replaces: a socket pair per runtime that the thread writes a byte to and
    the goroutine reads through the netpoller (a read's frames and two system calls per
    wake), or ``gosim.syscall`` (a trio task and trio's thread pool per call).
    """

    __slots__ = ("_held_clock", "_syscalls", "_used", "_value", "_waiter")

    def __init__(self, waiter: Waiter) -> None:
        rt = _state.rt
        if rt is None:
            raise NotInRuntime("ThreadWake: not inside a gosim runtime")
        syscalls: Syscalls = rt.syscalls
        self._syscalls = syscalls
        self._waiter = waiter
        self._value: Any = None
        self._used = False
        self._held_clock = syscalls._hold_virtual_clock()
        if self._held_clock:
            syscalls.thread_clock_holds += 1
        syscalls.thread_waits += 1

    def settle(self, value: Any = None) -> None:
        """Settle the waiter with ``value`` on its runtime's driver, soon; from any
        thread, once (RuntimeError on a second call)."""
        if self._used:
            raise RuntimeError("ThreadWake.settle: it was settled already")
        self._used = True
        self._value = value
        self._syscalls.from_thread(self)


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
