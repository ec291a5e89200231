"""The driver: Go's ``schedule``/``findRunnable``/``execute`` loop over the Ps.

How a goroutine runs, fast to slow
----------------------------------
1. A channel operation that can complete does so inside the goroutine's own coroutine:
   no yield to the driver, no allocation beyond the value (``gosim._chan``).
2. One that cannot parks: the coroutine yields the ``PARK`` trap to the driver, which
   marks the G waiting. Whoever completes the operation later calls ``goready``
   (``Runtime.goready``), which puts the G in the current P's ``runnext`` (the previous
   ``runnext`` is kicked to the local queue tail), so a woken partner runs next, as in Go.
3. The driver's loop is Go's ``schedule``: take the next P that holds an M
   (``rt.running``, in turn), find a G for it and step it with ``coro.send`` until it
   traps, for a burst of up to 61 switches. The order a G is looked for in: every
   61st tick of the P the global queue first, then ``runnext``, the local queue, then
   ``findrunnable``: expired timers, which run, and when some did, the netpoller is
   polled right after them (its goroutines take ``runnext``, so I/O that is already
   there runs before a deadline's goroutine); then goroutines readied from outside,
   the global queue, the netpoller (polled without blocking), and last stealing half
   of a running victim's local queue, never its ``runnext``, which the victim runs on
   its next turn.
4. A P that finds nothing goes idle (``Runtime.pidleput``) and takes no turns: idle Ps
   cost nothing. ``Runtime.wakep`` gives one a turn, spinning, when a G lands where it
   could take it (a local queue's tail, the global queue) and no P spins already; a
   timer of its heap that readies a goroutine there, or a goroutine back from a
   syscall to it, takes it back too. When the last running P finds nothing the driver
   idles in trio until the earliest timer, I/O on the netpoller, a syscall's or trio
   call's completion, another OS thread's settle (``ThreadWake``), a new ``rt.call``
   or a signal relayed from the OS
   (:mod:`._signal`, relayed here and in step 5). If none of those can ever come, it stops
   with Go's deadlock error and a goroutine dump.
5. Every ``PERIODIC_MASK + 1`` switches the driver polls the netpoller (its goroutines
   to the global queue's tail, behind those already waiting), then runs expired timers
   and takes goroutines readied from outside, and at least every millisecond of real
   time yields to trio (one checkpoint costs about 4 µs), so I/O and other trio tasks
   make progress under load.

6. Deterministic runs may hand the choice of the next G to a *chooser*
   (``gosim.lowlevel.set_chooser``, for ``gosim.testing``'s exploration): ``_choose``
   lists what the P in turn could take in the order step 3 takes it, so index 0 is the
   decision made without one, and each burst is then one switch on the Python loop.

The driver is functions over a :class:`~._runtime.Runtime` (as Go's are over ``sched``);
the state they keep between turns is the runtime's. The C accelerator (optional) has
twins of the hot parts in ``gosim/_speedups_sched.c.h``: the G, P and runtime fields
as C structs, ``go``, ``goready``/``runqput``, ``goexit0`` and the inner loop of step 3
(``RuntimeBase._burst``, used when no trace is recorded; :func:`_python_burst` is the
Python one). Both take the same schedule for a seed.

Alternatives rejected: a trio task per goroutine (a trio wake-up costs ~4 µs, twenty
coroutine steps); in pure Python, a custom awaitable class for the fast path (slower
than a finished C future or a generator; in C, an awaitable with ``am_send`` is the
fastest of all and is what the accelerator uses); checking the clock on every switch
(~60 ns each) where a countdown does.

Mirrors Go's ``proc.go`` (``findRunnable``, ``schedule``, ``execute``, ``checkdead``).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import outcome
import trio

from gosim._core._accel import speedups
from gosim._core._dump import created_by, g_funcname, panic_line
from gosim._core._exceptions import Deadlock, GosimError
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
from gosim._core._syscall import (
    IDLE_IN_NETPOLL,
    IDLE_IN_TRIO,
    NOT_IDLE,
    _SyscallTrap,
    _TrioCallTrap,
)

if TYPE_CHECKING:
    from gosim._core._runtime import Runtime

FAIRNESS_TICKS: Final = 61  # schedule checks the global queue first every 61st tick
TRIO_YIELD_INTERVAL: Final = 0.001  # yield to trio at least this often under load
# The idle driver blocked in the netpoller wakes and gives trio a turn at least this
# often: a signal the kernel delivered to another thread (Ctrl-C) is run by the main
# thread only once it wakes, and a trio callback from a thread waits for a trio turn.
IDLE_TRIO_INTERVAL: Final = 0.05

# What the C inner loop (RuntimeBase._burst) hands back to the driver.
_BURST_END: Final = 0
_BURST_TRAP: Final = 1
_BURST_EXIT: Final = 2
# RuntimeBase._burst's signature: (p, g or None, burst_end) -> (code, g, payload).
_Burst = Callable[[P, G | None, int], tuple[int, G, Any]]


def _fail(rt: Runtime, exc: BaseException) -> None:
    if rt.failure is None:
        rt.failure = exc
    rt.stopped = True


def findrunnable(rt: Runtime, p: P) -> G | None:
    """The slow half of Go's findRunnable, after runnext and the local queue are empty."""
    if rt.timers.narmed:
        now = rt._clock_now()
        if p.timers.earliest() <= now:
            rt.timers.check(now)
            np_ = rt.netpoller
            if np_ is not None and np_.waiters():
                # I/O that arrived by now runs before the timers' goroutines, so a
                # deadline never fires on data that is already waiting to be read.
                _netpoll_into(rt, p, np_)
            g = rt.runqget(p)
            if g is not None:
                return g
    if rt.injectq:
        rt._drain_inject()
        g = rt.runqget(p)
        if g is not None:
            return g
    if rt.syscalls.from_threads:
        _take_from_threads(rt, p)
        g = rt.runqget(p)
        if g is not None:
            return g
    if rt.globrunq:
        return rt.globrunqget(p, 0)
    np_ = rt.netpoller
    if np_ is not None and np_.waiters() and _netpoll_into(rt, p, np_):
        # netpoll readied goroutines into this P (runnext first), as Go's findRunnable.
        g = rt.runqget(p)
        if g is not None:
            return g
    # Steal from the Ps that hold an M (p, whose turn this is, is not among them). Go's
    # stealWork skips idle Ps too (idlepMask): their queues are empty. One round, from a
    # random victim: Go tries stealTries (4) rounds because its victims run meanwhile;
    # here nothing runs between two rounds, so a second would see the same queues. Go
    # steals a victim's runnext in its last round because the victim's M may be stuck
    # running a long G; here every running P gets its turn within one rotation, so its
    # runnext is about to run anyway: stealing it would only move goroutines off their
    # P (a woken partner, a G back from a syscall) for nothing.
    running = rt.running
    nvictims = len(running)
    if nvictims:
        start = rt.rng.randrange(nvictims) if nvictims > 1 else 0
        for i in range(nvictims):
            g = rt.runqsteal(p, running[(start + i) % nvictims], False)
            if g is not None:
                return g
    return None


def _check_idle_timers(rt: Runtime) -> None:
    """Once a turn while an idle P has armed timers: run those that are due (on their
    P, which takes turns again when one readied a goroutine there). The running Ps check
    their own heaps when they run dry; an idle P gets no turn to check its own."""
    now = rt._clock_now()
    if now >= rt.pidle_when:
        rt.timers.check(now)
        rt.pidle_when = min((q.timers.earliest() for q in rt.pidle), default=math.inf)


def _netpoll_into(rt: Runtime, p: P, np_: NetPoller) -> int:
    """Poll without blocking; readied goroutines land on p (Go's findRunnable)."""
    saved = rt.curp
    rt.curp = p
    try:
        return np_.poll()
    finally:
        rt.curp = saved


def _take_from_threads(rt: Runtime, p: P) -> None:
    """Settle the waiters other OS threads handed over (``ThreadWake``); the goroutines
    woken land on p. A settle that raises (a waiter's callback) stops the runtime with
    its error, as a relayed signal's does."""
    saved = rt.curp
    rt.curp = p
    try:
        rt.syscalls.take_from_threads()
    except Exception as exc:
        _fail(rt, exc)
    finally:
        rt.curp = saved


async def _trio_turn(rt: Runtime) -> None:
    """Give trio's scheduler a turn (its tasks, its Ctrl-C), the runtime's state
    cleared meanwhile so nothing trio runs mistakes itself for a goroutine."""
    _state.rt = None
    try:
        await trio.lowlevel.checkpoint()
    finally:
        _state.rt = rt
    rt.last_trio_yield = rt._clock_now()


async def _idle(rt: Runtime) -> None:
    """No P found work: wait for a timer, an outside completion, a new call or a signal.

    Returns after one wait, or at once when there is something to look at again (a
    relayed signal, work readied from outside, a timer already due); stops the runtime
    with Go's deadlock error when nothing can ever wake a goroutine.
    """
    if rt.signals.pending:
        # Before deciding whether anything can wake a goroutine: a relayed signal may
        # have readied one.
        _relay_signals(rt)
        return
    if rt.injectq or rt.syscalls.from_threads:
        return
    nxt = rt.timers.earliest() if rt.timers.narmed else math.inf
    np_ = rt.netpoller
    io_waiters = np_.waiters() if np_ is not None else 0
    if _nothing_can_wake(rt, nxt, io_waiters):
        _checkdead(rt)
        return
    now = rt._clock_now()
    if nxt <= now:
        rt.timers.check(now)
        return
    deadline = min(nxt, rt.stats.schedtrace_next)
    jump = rt.virtual_jump
    syscalls = rt.syscalls
    if (
        jump is not None
        and not syscalls.nexternal
        and not syscalls.thread_waits
        and not io_waiters
        and not rt.stopped
    ):
        _jump_virtual_clock(rt, jump, nxt, deadline, now)
    elif (  # the real clock, and only I/O or a timer can wake a goroutine
        np_ is not None
        and jump is None
        and not syscalls.nexternal
        and not rt.open_mode
        and not rt.stopped
    ):
        await _netpoll_block(rt, np_, nxt, deadline, now)
    else:
        await _trio_wait(rt, np_, nxt, deadline, io_waiters or syscalls.thread_waits)


def _nothing_can_wake(rt: Runtime, nxt: float, io_waiters: int) -> bool:
    """True when no goroutine can ever be woken (``nxt``: the earliest armed timer).

    Nothing can when there is no timer that can (channel timers nobody receives from
    cannot, as in Go 1.23), no I/O waiter, no syscall or trio call in flight, no
    ``ThreadWake`` outstanding and no signal relayed from the OS; an open runtime
    with no goroutine left is waiting for its next ``rt.call`` instead.
    """
    return bool(
        rt.syscalls.nexternal == 0
        and rt.syscalls.thread_waits == 0
        and io_waiters == 0
        and not rt.signals.nwake
        and (rt.allg or not rt.open_mode)
        and (nxt == math.inf or not rt.timers.can_wake())
    )


def _jump_virtual_clock(
    rt: Runtime, jump: Callable[[float], None], nxt: float, deadline: float, now: float
) -> None:
    """Advance the virtual clock from now to deadline, then run the timers due by then
    (``nxt``: the earliest) on their Ps, which take turns again (``Timers.check``)."""
    # Virtual time under gosim.run, and the driver is the only trio task that can act:
    # trio's autojump would advance the clock to this very deadline after a round of
    # its scheduler; advancing it here costs a float add.
    jump(deadline - now)
    rt.last_trio_yield = now = rt._clock_now()
    _after_wait(rt, nxt, now)


async def _netpoll_block(
    rt: Runtime, np_: NetPoller, nxt: float, deadline: float, now: float
) -> None:
    """Block in the netpoller until I/O, the deadline or IDLE_TRIO_INTERVAL, whichever
    comes first, then run the timers due (``nxt``: the earliest); or, when trio has not
    had a turn for IDLE_TRIO_INTERVAL, give it one instead and return."""
    # Under gosim.run on the real clock, with no syscall or trio call in flight, the
    # driver is the only trio task that can act, and only I/O or a timer can wake a
    # goroutine: block in the netpoller itself until the earliest deadline, as Go's
    # findRunnable blocks in netpoll(delay). Through trio, each idle would cost a
    # round of its scheduler (a cancel scope, wait_readable's registration, a task
    # switch): most of an idle's CPU under durable calls, which idle once a commit.
    # The GIL is released meanwhile; an OS thread that wakes a goroutine without
    # trio does it through the netpoller (a store's committer). The wait is cut at
    # IDLE_TRIO_INTERVAL, and trio gets a turn that often: a Ctrl-C caught by
    # another thread (trio's wakeup fd is not in this epoll) is then raised here.
    if now - rt.last_trio_yield >= IDLE_TRIO_INTERVAL:
        await _trio_turn(rt)
        # Look again from the top: the turn took time, and the earliest timer may
        # be due now. Polling until a deadline that has passed would block until
        # I/O arrives, which may be never (the reader that would drain a full
        # socket asleep on that very timer).
        return
    # Marked before the last look at from_threads (see Syscalls.from_thread): a thread
    # that hands a settle over from here on breaks the poll.
    syscalls = rt.syscalls
    syscalls.idle_in = IDLE_IN_NETPOLL
    try:
        if not syscalls.from_threads:
            np_.poll(False, min(deadline - now, IDLE_TRIO_INTERVAL))
    finally:
        syscalls.idle_in = NOT_IDLE
    _after_wait(rt, nxt, rt._clock_now())


async def _trio_wait(
    rt: Runtime, np_: NetPoller | None, nxt: float, deadline: float, watch_netpoller: int
) -> None:
    """Wait in trio until the deadline, the netpoller's descriptor when there is a
    reason to watch it (``watch_netpoller``: I/O waiters, or ThreadWakes, which break
    the netpoller), or ``rt.idle_scope``'s cancel (a syscall's or trio call's
    completion, a new call, a signal, a stop, another thread's settle when the
    netpoller is not watched); then run the timers due (``nxt``: the earliest) and
    poll the netpoller."""
    syscalls = rt.syscalls
    _state.rt = None
    try:
        with trio.move_on_at(deadline) as scope:
            rt.idle_scope = scope
            # Marked before the last look at from_threads (see Syscalls.from_thread).
            watched = np_ is not None and watch_netpoller
            syscalls.idle_in = IDLE_IN_NETPOLL if watched else IDLE_IN_TRIO
            if rt.stopped or syscalls.from_threads:
                scope.cancel()
            if np_ is not None and watched:
                await trio.lowlevel.wait_readable(np_.fileno())
            else:
                await trio.sleep_forever()
    finally:
        syscalls.idle_in = NOT_IDLE
        _state.rt = rt
        rt.idle_scope = None
    rt.last_trio_yield = now = rt._clock_now()
    if nxt <= now:
        rt.timers.check(now)
    if np_ is not None and watch_netpoller:
        # Onto rt.curp, the P that idled, which looks again next. After the timers:
        # I/O that is waiting runs before a deadline's goroutine (see findrunnable).
        np_.poll()
    if rt.stats.schedtrace_interval:
        rt.stats.maybe_schedtrace(rt.last_trio_yield)


def _after_wait(rt: Runtime, nxt: float, now: float) -> None:
    """After the idle driver waited until now: the timers due by then run (``nxt``: the
    earliest), and the SCHED line is printed when one is due."""
    if nxt <= now:
        rt.timers.check(now)
    if rt.stats.schedtrace_interval:
        rt.stats.maybe_schedtrace(now)


def _relay_signals(rt: Runtime) -> None:
    """Relay the signals caught since the last time (``_signal``), on the driver. A
    relay that fails (a send on a channel closed while notified) stops the runtime with
    its error, as the panic in Go's signal-relaying goroutine would."""
    try:
        rt.signals.flush()
    except Exception as exc:
        _fail(rt, exc)


def _checkdead(rt: Runtime) -> None:
    """Nothing can ever run again: Go's checkdead."""
    if not rt.allg and rt.main_goexited:
        _fail(rt, Deadlock("no goroutines (main called runtime.Goexit) - deadlock!", ""))
        return
    dump = rt.goroutine_dump()
    _fail(rt, Deadlock("all goroutines are asleep - deadlock!\n\n" + dump, dump))


async def _periodic(rt: Runtime) -> None:
    """Every PERIODIC_MASK+1 switches: timers, outside completions, a trio yield."""
    now = rt._clock_now()
    np_ = rt.netpoller
    if np_ is not None and np_.waiters():
        # sysmon's netpoll: I/O is not starved by busy goroutines. Before the timers,
        # for the same reason as in findrunnable. Into the global queue, in arrival
        # order (see Runtime.globready): I/O readied now must not overtake what
        # already waits there.
        np_.poll(True)
    if rt.timers.narmed:
        rt.timers.check(now)
    if rt.injectq:
        rt._drain_inject()
    if rt.syscalls.from_threads:
        _take_from_threads(rt, rt.curp)
    if rt.signals.pending:
        _relay_signals(rt)
    if rt.stats.schedtrace_interval:
        rt.stats.maybe_schedtrace(now)
    if now - rt.last_trio_yield >= TRIO_YIELD_INTERVAL or (rt.nswitch & 0xFFF) == 0:
        await _trio_turn(rt)


async def drive(rt: Runtime) -> None:
    """The driver task: Go's schedule loop over all Ps until the runtime stops."""
    clock = trio.lowlevel.current_clock()
    rt.syscalls.trio_token = trio.lowlevel.current_trio_token()
    rt.now = rt._clock_now = _clock_reader(clock, rt.virtual_jump is not None)
    rt.stats.start_time = rt.last_trio_yield = clock.current_time()
    if rt.stats.schedtrace_interval:
        rt.stats.schedtrace_next = rt.stats.start_time + rt.stats.schedtrace_interval
    refill_op_budget()  # the same seed, the same schedule, whatever ran before
    prev = _state.rt
    _state.rt = rt
    try:
        await schedule(rt)
    finally:
        _state.rt = prev
        rt.curg = None


async def schedule(rt: Runtime) -> None:
    """Go's schedule loop. Each turn takes the next P that holds an M and runs a burst
    of its Gs.

    A burst ends after FAIRNESS_TICKS switches of its P (so the global queue is looked
    at first every 61 ticks, as in Go), when the P runs dry, or when periodic duties are
    due: the hot loop stays tight. The Ps that hold an M (``rt.running``) take turns in
    order; a P that finds no work goes idle (``pidle``) and costs nothing until
    ``wakep`` or its own timer gives it turns again, as Go's idle Ps do. With one driver
    thread the running Ps are time-sliced as an OS slices threads on one core: a burst
    each, not one switch each, so that several Ps cost what one does.
    """
    running = rt.running
    trace = rt.trace
    # The C inner loop, when built; it records no trace events, so a traced run
    # takes the Python loop.
    burst = rt._burst if _burst_available and trace is None else None
    syscalls = rt.syscalls  # held: read after every burst
    # What a turn does on its common path is written out here, not called: a turn can
    # come as often as an operation (a P that runs dry after a switch or two).
    while not rt.stopped:
        if rt.pidle_when != math.inf:
            _check_idle_timers(rt)
        p = running.popleft()
        g: G | None = None
        chooser = rt.chooser  # read every turn: set by a goroutine once the driver runs
        if chooser is not None:
            g = _choose(rt, p, chooser)
        elif p.schedtick >= FAIRNESS_TICKS:
            p.schedtick = 0
            if rt.globrunq:
                g = rt.globrunqget(p, 1)
        if g is None:
            g = p.runnext
            if g is not None:
                p.runnext = None
            elif p.runq:
                g = p.runq.popleft()
            else:
                g = _findrunnable_chosen(rt, p, chooser)
                if g is None:
                    if running:
                        rt.pidleput(p)  # other Ps hold Ms: this one stops
                    else:
                        # The last P with an M: it idles in trio (Go's last M blocks in
                        # netpoll until a timer, I/O or outside work), then looks again.
                        rt.stopspinning(p)
                        rt.curp = p
                        running.append(p)
                        await _idle(rt)
                    continue
        if p.spinning:
            rt.resetspinning(p)
        rt.curp = p
        burst_start = rt.nswitch
        # A chooser decides every switch: a burst of one.
        burst_end = burst_start + (FAIRNESS_TICKS - p.schedtick if chooser is None else 1)
        # The hot loop: execute g, then the next G of this P, until the burst ends.
        if burst is not None and chooser is None:
            # The same loop in C (gosim._speedups); what it hands back instead of
            # ending the burst is handled off this path.
            code, g, payload = burst(p, g, burst_end)
            if code != _BURST_END and not _handed_back(rt, burst, p, burst_end, code, g, payload):
                return
            nsw = rt.nswitch
        else:
            nsw = _python_burst(rt, p, g, burst_end)
            if nsw < 0:
                return
        rt.curg = None
        p.schedtick += nsw - burst_start
        if p.id < len(rt.allp) and rt.allp[p.id] is p:
            running.append(p)  # else procresize destroyed it during its burst
        if syscalls.inline_call is not None:
            await syscalls.run_inline_call()
        if not (nsw & PERIODIC_MASK):
            await _periodic(rt)


def _findrunnable_chosen(rt: Runtime, p: P, chooser: Callable[[list[int]], int] | None) -> G | None:
    """``findrunnable``'s G, or with a chooser its choice among that G and the rest p
    could take (``_choose``); None when p found no work."""
    g = findrunnable(rt, p)
    if g is not None and chooser is not None:
        # What findrunnable found (a timer's goroutines, a steal, a batch of the global
        # queue) is a choice too: back to the head of p's queue, where the default order
        # takes it first, and chosen among the rest.
        p.runq.appendleft(g)
        g = _choose(rt, p, chooser)
    return g


def _handed_back(
    rt: Runtime, burst: _Burst, p: P, burst_end: int, code: int, g: G, payload: Any
) -> bool:
    """Handle what the C inner loop (``RuntimeBase._burst``) handed back instead of
    ending the burst (``code``: a trap other than PARK, an awaited exit, an error), then
    run the rest of the burst in C, handling each hand-back alike. False when the
    runtime stopped for good (a panic, a fatal error); else the burst is over.

    With ``schedule``'s call of the loop, this is ``_python_burst`` in effect: the same
    switches, the same outcome."""
    while True:
        if code == _BURST_TRAP:
            # A chooser set meanwhile (lowlevel.set_chooser, which yields) decides from
            # the next switch on: the burst ends.
            if _trap_slow(rt, g, p, payload) or rt.chooser is not None:
                return True
        elif code == _BURST_EXIT:
            if _exited(rt, g, payload):
                return True
        elif isinstance(payload, _Goexit):
            if _goexited(rt, g, p):
                return True
        elif isinstance(payload, Exception):
            if not _raised(rt, g, p, payload):
                return False
        else:
            rt.curg = None
            _fail(rt, payload)
            return False
        # Given None for g, the C loop takes p's next G unless the burst is over.
        code, g, payload = burst(p, None, burst_end)
        if code == _BURST_END:
            return True


def _choose(rt: Runtime, p: P, chooser: Callable[[list[int]], int]) -> G | None:
    """The G that p runs next when a chooser decides (``lowlevel.set_chooser``), taken
    out of its queue; None when p's queues and the global queue are empty.

    The candidates are every G that p could take without looking further: the global
    queue's head first when the fairness tick is due, then ``runnext``, the local queue
    and the global queue, in that order: the order the scheduler takes them in without a
    chooser, so index 0 is always the default decision. The chooser is asked only when
    there are two or more, with their goids; it returns an index into them.
    """
    runnext = p.runnext
    runq = p.runq
    gq = rt.globrunq
    n = (runnext is not None) + len(runq) + len(gq)
    if n == 0:
        return None
    fair = False
    if p.schedtick >= FAIRNESS_TICKS:
        p.schedtick = 0
        fair = bool(gq)
    cands: list[G] = [gq[0]] if fair else []
    if runnext is not None:
        cands.append(runnext)
    cands.extend(runq)
    cands.extend(itertools.islice(gq, 1 if fair else 0, None))
    i = 0
    if n > 1:
        i = chooser([c.goid for c in cands])
        if type(i) is not int or not 0 <= i < n:
            raise ValueError(f"scheduler chooser returned {i!r}, not an index in range({n})")
    g = cands[i]
    if g is runnext:
        p.runnext = None
    else:
        # By identity: G records compare by identity, and the positions are known.
        for q in (runq, gq):
            for k, x in enumerate(q):
                if x is g:
                    del q[k]
                    return g
    return g


def _python_burst(rt: Runtime, p: P, g: G, burst_end: int) -> int:
    """The driver's inner loop: execute g, then the next G of p, until the burst
    ends. Returns the switch count, or -1 when the runtime stopped for good (a panic,
    a fatal error). ``RuntimeBase._burst`` is its C twin: keep the two in step.
    """
    # Invariant: rt.curg is g while g's coroutine runs; None outside this loop.
    trace = rt.trace
    runq = p.runq
    nsw = rt.nswitch
    while True:
        rt.curg = g
        g.status = RUNNING
        nsw += 1
        rt.nswitch = nsw
        if trace is not None:
            trace.emit(rt, "run", p.id, g.goid, 0, 0)
        try:
            trap = g.coro.send(g.param)
        except StopIteration as stop:
            rt.goexit0(g, p)
            if (rt.main_goexited or g.goid in rt.call_boxes) and _exited(rt, g, stop.value):
                break
        except _Goexit:
            if _goexited(rt, g, p):
                break
        except Exception as exc:
            if not _raised(rt, g, p, exc):
                return -1
        except BaseException as exc:
            rt.curg = None
            _fail(rt, exc)
            return -1
        else:
            if trap is PARK:
                g.status = WAITING
                if trace is not None:
                    trace.emit(rt, "park", p.id, g.goid, 0, 0)
            elif _trap_slow(rt, g, p, trap) or rt.chooser is not None:
                break  # stopped, or a chooser was set (see schedule)
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


def _exited(rt: Runtime, g: G, value: Any) -> bool:
    """After goexit0 of a goroutine with a caller waiting for its result (main,
    ``rt.call``), or of anyone once main called goexit; True if the runtime stopped."""
    box = rt.call_boxes.pop(g.goid, None)
    if box is not None:
        box.deliver(outcome.Value(value))
    if g is rt.main_g and not rt.open_mode:
        rt.stopped = True
    elif rt.main_goexited and not rt.allg:
        _checkdead(rt)
    return rt.stopped


def _goexited(rt: Runtime, g: G, p: P) -> bool:
    """g called goexit (True if that stopped the runtime).

    From main under ``run``, the program goes on without main.
    """
    box = rt.call_boxes.get(g.goid)
    if box is not None and (rt.open_mode or g is not rt.main_g):
        del rt.call_boxes[g.goid]
        box.deliver(outcome.Error(GosimError("the called goroutine ended with goexit")))
    if g is rt.main_g and not rt.open_mode:
        rt.main_goexited = True
        rt.main_g = None
    rt.goexit0(g, p)
    if rt.main_goexited and not rt.allg:
        _checkdead(rt)
    return rt.stopped


def _raised(rt: Runtime, g: G, p: P, exc: Exception) -> bool:
    """g raised exc: deliver it to an ``rt.call`` caller (True: the driver goes on)
    or panic, which stops the runtime (False)."""
    if g.goid in rt.call_boxes and (rt.open_mode or g is not rt.main_g):
        # rt.call: the exception belongs to the trio caller, not a panic.
        rt.call_boxes.pop(g.goid).deliver(outcome.Error(exc))
        rt.goexit0(g, p)
        return True
    rt.curg = None
    _panic(rt, g, exc)
    return False


def _panic(rt: Runtime, g: G, exc: Exception) -> None:
    # The exception stops the runtime and leaves run() as itself (see Panic); Go's crash
    # report rides along as a note, so the goroutine it escaped is not lost.
    report = f"{panic_line(exc)}\n\ngoroutine {g.goid} [running]:\n{g_funcname(g)}(...)"
    creator = created_by(g)
    if creator is not None:
        report += "\n" + creator
    exc.add_note(report)
    g.status = DEAD
    rt.allg.pop(g.goid, None)
    g.coro = g.elem = g.param = g.p = None
    _fail(rt, exc)


def _trap_slow(rt: Runtime, g: G, p: P, trap: Any) -> bool:
    """Handle a trap other than PARK; True when it stopped the runtime."""
    if trap is GOSCHED or trap is PREEMPT:
        g.status = RUNNABLE
        g.param = None
        if trap is PREEMPT:
            rt.stats.npreempt += 1
        if rt.trace is not None:
            rt.trace.emit(rt, "preempt" if trap is PREEMPT else "gosched", p.id, g.goid, 0, 0)
        rt.globrunq.append(g)
        return rt.stopped
    if type(trap) is _SyscallTrap:
        rt.syscalls.enter(g, p, trap)
        return rt.stopped
    if type(trap) is _TrioCallTrap:
        rt.syscalls.start_trio_call(g, p, trap)
        return rt.stopped
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
            rt.goexit0(g, p)
            return rt.stopped
        if isinstance(exc, Exception):
            _panic(rt, g, exc)
        else:
            _fail(rt, exc)
        return rt.stopped
    # It caught the error and trapped again: treat like a gosched to keep it simple.
    rt.globrunq.append(g)
    return rt.stopped


# ------------------------------------------------------------------ shutdown


def close_all(rt: Runtime) -> None:
    """Close every live goroutine's coroutine so its ``finally`` blocks run, and put
    back the signal handlers the runtime replaced and the virtual clock's autojump that
    outstanding ThreadWakes held."""
    prev = _state.rt
    _state.rt = None  # a finally block must not schedule work on a stopped runtime
    try:
        for goid in sorted(rt.allg):
            g = rt.allg[goid]
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
        rt.allg.clear()
        closer = getattr(rt.netpoller, "close", None)
        if closer is not None:
            closer()  # sockets still open when the runtime ends are closed
    finally:
        rt.signals.close()  # the signal handlers it replaced are back
        rt.syscalls.end_thread_waits()  # a virtual clock they held goes on
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
