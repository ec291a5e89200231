"""The driver: Go's ``schedule``/``findRunnable``/``execute`` loop over the Ps.

How a goroutine runs, fast to slow
----------------------------------
1. A channel operation that can complete does so inside the goroutine's own coroutine:
   no yield to the driver, no allocation beyond the value (``gosim._chan``).
2. One that cannot parks: the coroutine yields the ``PARK`` trap to the driver, which
   marks the G waiting. Whoever completes the operation later calls ``goready``
   (``_runq``), which puts the G in the current P's ``runnext`` (the previous
   ``runnext`` is kicked to the local queue tail), so a woken partner runs next, as in Go.
3. The driver's loop is Go's ``schedule``: take the next P in turn, find a G for it
   and step it with ``coro.send`` until it traps. The order a G is looked for in: every
   61st tick the global queue first, then ``runnext``, the local queue, then
   ``findrunnable``: expired timers (with the netpoller polled first when some expired,
   so I/O that is already there runs before a deadline's goroutine), goroutines readied
   from outside, the global queue, the netpoller (polled without blocking), then
   stealing half of a random victim's local queue for a few rounds; never its
   ``runnext``, which the victim runs on its next turn.
4. When no P finds work the driver idles in trio until the earliest timer, a syscall's
   or trio call's completion, or a new ``rt.call``. If none of those can ever come, it
   stops with Go's deadlock error and a goroutine dump.
5. Every few hundred steps the driver checks timers and, at least every millisecond of
   real time, yields to trio (one checkpoint costs about 4 µs), so I/O and other trio
   tasks make progress under load.

The C accelerator (``gosim/_speedups.c``, optional) has twins of the hot parts: the
G, P and runtime fields as C structs, ``go``, ``goready``/``runqput``, ``goexit0`` and
the inner loop of step 3 (``RuntimeBase._burst``, used when no trace is recorded;
:meth:`Scheduler._python_burst` is the Python one). Both take the same schedule for a
seed.

Alternatives rejected: a trio task per goroutine (a trio wake-up costs ~4 µs, twenty
coroutine steps); in pure Python, a custom awaitable class for the fast path (slower
than a finished C future or a generator; in C, an awaitable with ``am_send`` is the
fastest of all and is what the accelerator uses); checking the clock on every switch
(~60 ns each) where a countdown does.

Mirrors Go's ``proc.go`` (``findRunnable``, ``schedule``, ``execute``, ``checkdead``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Final

import outcome
import trio

from gosim._core._accel import speedups
from gosim._core._dump import created_by, g_funcname, goroutine_dump, panic_line
from gosim._core._exceptions import Deadlock, GosimError, Panic
from gosim._core._g import DEAD, RUNNABLE, RUNNING, WAITING, G
from gosim._core._netpoll import NetPoller
from gosim._core._runq import P, _burst_available
from gosim._core._state import (
    GOSCHED,
    PARK,
    PERIODIC_MASK,
    PREEMPT,
    _Goexit,
    _state,
    refill_op_budget,
)
from gosim._core._syscall import Syscalls, _SyscallTrap, _TrioCallTrap

FAIRNESS_TICKS: Final = 61  # schedule checks the global queue first every 61st tick
STEAL_ROUNDS: Final = 4  # Go's stealTries
TRIO_YIELD_INTERVAL: Final = 0.001  # yield to trio at least this often under load

# What the C inner loop (RuntimeBase._burst) hands back to the driver.
_BURST_END: Final = 0
_BURST_TRAP: Final = 1
_BURST_EXIT: Final = 2


class Scheduler(Syscalls):
    """The driver of one runtime: the schedule loop, its idling, exits, panics, deadlock."""

    def _init_room(self) -> None:
        super()._init_room()
        self.netpoller: NetPoller | None = None
        self.last_trio_yield = 0.0
        self.stopped = False
        self.failure: BaseException | None = None
        self.main_g: G | None = None
        self.open_mode = True  # False under gosim.run: main's return ends the runtime
        #: Under ``gosim.run(virtual_time=True)``: the MockClock's ``jump``, which _idle
        #: calls itself when no other trio task can act (see _idle).
        self.virtual_jump: Callable[[float], None] | None = None

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
                g = self.runqget(p)
                if g is not None:
                    return g
        if self.injectq:
            self._drain_inject()
            g = self.runqget(p)
            if g is not None:
                return g
        if self.globrunq:
            return self.globrunqget(p, 0)
        np_ = self.netpoller
        if np_ is not None and np_.waiters() and self._netpoll_into(p, np_):
            # netpoll readied goroutines into this P (runnext first), as Go's findRunnable.
            g = self.runqget(p)
            if g is not None:
                return g
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
        jump = self.virtual_jump
        if jump is not None and not self.nexternal and not io_waiters and not self.stopped:
            # Virtual time under gosim.run, and the driver is the only trio task that
            # can act: trio's autojump would advance the clock to this very deadline
            # after a round of its scheduler; advancing it here costs a float add.
            jump(deadline - now)
            self.last_trio_yield = self._clock_now()
            if self.schedtrace_interval:
                self._maybe_schedtrace(self.last_trio_yield)
            return
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
            _state.rt = self  # type: ignore[assignment]  # self is the Runtime this room is part of
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
        return goroutine_dump(self.allg.values())

    async def _periodic(self) -> None:
        """Every PERIODIC_MASK+1 switches: timers, outside completions, a trio yield."""
        now = self._clock_now()
        np_ = self.netpoller
        if np_ is not None and np_.waiters():
            # sysmon's netpoll: I/O is not starved by busy goroutines. Before the timers,
            # for the same reason as in findrunnable. Into the global queue, in arrival
            # order (see Runtime.globready): I/O readied now must not overtake what
            # already waits there.
            np_.poll(True)
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
                _state.rt = self  # type: ignore[assignment]  # self is the Runtime this room is part of
            self.last_trio_yield = self._clock_now()

    async def drive(self) -> None:
        """The driver task: Go's schedule loop over all Ps until the runtime stops."""
        clock = trio.lowlevel.current_clock()
        self.now = self._clock_now = _clock_reader(clock, self.virtual_jump is not None)
        self.start_time = self.last_trio_yield = clock.current_time()
        if self.schedtrace_interval:
            self.schedtrace_next = self.start_time + self.schedtrace_interval
        refill_op_budget()  # the same seed, the same schedule, whatever ran before
        prev = _state.rt
        _state.rt = self  # type: ignore[assignment]  # self is the Runtime this room is part of
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
        msg = f"{panic_line(exc)}\n\ngoroutine {g.goid} [running]:\n{g_funcname(g)}(...)"
        creator = created_by(g)
        if creator is not None:
            msg += "\n" + creator
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


def _clock_reader(clock: trio.abc.Clock, own_virtual: bool = False) -> Callable[[], float]:
    """How the runtime reads ``clock`` (``rt.now``): its ``current_time``, or for
    trio's own SystemClock the C twin of that method (``gosim._speedups.MonotonicClock``,
    the same offset plus ``time.perf_counter()``), one Python frame less on every
    clock read. The twin is kept only when a read of it falls between two of the
    method's: the same timebase, whatever trio's clock turns out to be.

    ``own_virtual``: ``clock`` is the MockClock that ``gosim.run(virtual_time=True)``
    made, whose rate stays 0 (no one else holds it): its time is its virtual base,
    which only its jumps move, read without a Python frame (the method would add
    ``0 * (perf_counter() - base)`` to it: the same float, three calls later). A
    simulation reads its clock millions of times."""
    read = clock.current_time
    cls = type(clock)
    if own_virtual and getattr(clock, "rate", None) == 0:
        base = functools.partial(getattr, clock, "_virtual_base")
        try:
            if base() == read():
                return base
        except AttributeError:  # another trio's MockClock: its own method, then
            pass
        return read
    if speedups is None or (cls.__module__, cls.__qualname__) != ("trio._core._run", "SystemClock"):
        return read  # a clock of the user's (virtual time included) reads itself
    fast: Callable[[], float] = speedups.MonotonicClock(clock.offset)  # type: ignore[attr-defined]
    before = read()
    now = fast()
    return fast if before <= now <= read() else read
