"""Goroutine records (G) and select waiters (Sudog): the data the scheduler moves around.

Glossary
--------
G
    One goroutine: a native coroutine plus the record the scheduler keeps for it. Gs sit
    in exactly one place at a time: a P's ``runnext`` slot or local run queue, the global
    run queue, a channel's wait queue (parked), a timer (sleeping), a syscall thread, or
    nowhere (running). Mirrors Go's ``g`` (``runtime2.go``).
Sudog
    A G waiting on one case of a ``select``: Go's ``sudog`` with ``isSelect`` set. A plain
    channel operation queues the G itself (no Sudog) because it waits on one channel only;
    that saves an allocation on the hottest path. With the C accelerator built,
    :data:`Sudog` is ``gosim._speedups.Sudog`` (same constructor and fields).

Status values follow Go's ``_Gidle`` ... ``_Gdead`` (``runtime2.go``), with the
transitions tabled in :data:`TRANSITIONS`. With ``GOSIM_DEBUG=1`` in the environment
(:data:`DEBUG`) every status change is checked against the table, as Go's
``casgstatus`` does, and an illegal one raises :class:`RuntimeInternalError` through
``throw``: assignments from Python go through a checking ``status`` property of
:class:`G`, and the C accelerator checks its own writes (``casgstatus`` in
``gosim/_speedups_sched.c.h``). Off, ``status`` is the plain slot: the check costs nothing.
``tests/gosim/test_g.py`` shows a bad transition caught on both paths.

G records avoid reference cycles once the goroutine is dead: the scheduler clears
``coro``, ``param`` and ``elem`` so a dead G on the free list holds nothing alive.
"""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Any, Final

from gosim._core._accel import speedups
from gosim._core._exceptions import throw

# GOSIM_DEBUG=1: check every G status change and the scheduler's preconditions (Go's
# throws); read once at import, so the checks cost nothing when it is off.
DEBUG: Final = os.environ.get("GOSIM_DEBUG", "") not in ("", "0")

IDLE: Final = 0  # just allocated, never run (Go's _Gidle)
RUNNABLE: Final = 1  # on a run queue, not running (_Grunnable)
RUNNING: Final = 2  # being stepped by the driver on some P (_Grunning)
SYSCALL: Final = 3  # executing a blocking call on an OS thread (_Gsyscall)
WAITING: Final = 4  # parked: a channel, timer, lock or I/O will ready it (_Gwaiting)
DEAD: Final = 5  # exited; record on a free list for reuse (_Gdead)

STATUS_NAMES: Final = ("idle", "runnable", "running", "syscall", "waiting", "dead")

# Legal status transitions, as Go's casgstatus allows them. The scheduler only moves a G
# along these edges; a test drives programs under the debug flag that checks each move.
TRANSITIONS: Final[frozenset[tuple[int, int]]] = frozenset(
    {
        (IDLE, RUNNABLE),  # newproc
        (DEAD, RUNNABLE),  # newproc reusing a free G
        (RUNNABLE, RUNNING),  # execute
        (RUNNING, RUNNABLE),  # gosched, preemption
        (RUNNING, WAITING),  # gopark
        (RUNNING, SYSCALL),  # entersyscall
        (RUNNING, DEAD),  # goexit0
        (WAITING, RUNNABLE),  # goready
        (SYSCALL, RUNNABLE),  # exitsyscall
        (RUNNABLE, DEAD),  # runtime shutdown closes queued goroutines
        (WAITING, DEAD),  # runtime shutdown closes parked goroutines
        (SYSCALL, DEAD),  # runtime shutdown abandons a goroutine in a syscall
    }
)


class WaitReason(enum.StrEnum):
    """Why a goroutine is parked: Go's ``waitReason`` (``runtime2.go``), as dumps print it.

    Every park names one (``gosim.lowlevel.park``, :class:`gosim._core._wait.Waiter`),
    and a deadlock's goroutine dump shows it as Go's does (``goroutine 7 [sync.Mutex.Lock]:``),
    so a reader can tell a heartbeat from an RPC call from a select. The members are
    ``str`` (``StrEnum``): the value is Go's text, and the C accelerator stores and
    compares them as the strings they are. The first group is Go's own, with Go's words
    (Go 1.24's ``waitReasonStrings``); the second is what this project waits for that
    Go's runtime has no name of its own for (Go's programs would park in ``select``
    there, which is the ambiguity these remove). Go's reasons that have no gosim
    counterpart (the garbage collector's, the tracer's) are left out. Add a reason
    rather than reuse one, as ``runtime2.go`` asks.
    """

    # Go's.
    CHAN_RECEIVE = "chan receive"
    CHAN_SEND = "chan send"
    CHAN_RECEIVE_NIL = "chan receive (nil chan)"
    CHAN_SEND_NIL = "chan send (nil chan)"
    SELECT = "select"
    SELECT_NO_CASES = "select (no cases)"
    SLEEP = "sleep"
    SEMACQUIRE = "semacquire"
    SYNC_COND_WAIT = "sync.Cond.Wait"
    SYNC_MUTEX_LOCK = "sync.Mutex.Lock"
    SYNC_RWMUTEX_RLOCK = "sync.RWMutex.RLock"
    SYNC_RWMUTEX_LOCK = "sync.RWMutex.Lock"
    SYNC_WAITGROUP_WAIT = "sync.WaitGroup.Wait"
    IO_WAIT = "IO wait"
    # gosim's and its layers'.
    TRIO_CALL = "trio call"  # a trio call on the driver's trio run (gosim.trio_call)
    TIMER_WAIT = "timer wait"  # a wait until a runtime-clock deadline or an early ring
    HEARTBEAT = "heartbeat wait"  # a connection's heartbeat or idle timer (netframe)
    RPC_REPLY = "rpc reply"  # an RPC client's call waiting for its response
    HANDLER_REPLY = "netframe reply"  # a request whose reply a handler gives later
    HANDLER_ROOM = "netframe handler room"  # a connection reader waiting for a handler to end
    COMMIT_WAIT = "idempotency commit"  # a store operation waiting for its group commit
    WAITER = "waiter"  # a gosim.lowlevel.Waiter awaited without a reason of its own


# The names the channels, select and the core use (and the C accelerator is given).
WAIT_CHAN_RECEIVE: Final = WaitReason.CHAN_RECEIVE
WAIT_CHAN_SEND: Final = WaitReason.CHAN_SEND
WAIT_CHAN_RECEIVE_NIL: Final = WaitReason.CHAN_RECEIVE_NIL
WAIT_CHAN_SEND_NIL: Final = WaitReason.CHAN_SEND_NIL
WAIT_SELECT: Final = WaitReason.SELECT
WAIT_SELECT_NO_CASES: Final = WaitReason.SELECT_NO_CASES
WAIT_SLEEP: Final = WaitReason.SLEEP
WAIT_IO: Final = WaitReason.IO_WAIT
WAIT_TRIO_CALL: Final = WaitReason.TRIO_CALL

if TYPE_CHECKING or speedups is None:

    class _GFields:
        """A goroutine record's fields (the C accelerator's ``GBase`` has the same)."""

        __slots__ = (
            "coro",
            "creator",
            "elem",
            "fn",
            "goid",
            "ok",
            "p",
            "param",
            "parent",
            "selectdone",
            "status",
            "waitreason",
        )

        def __init__(self) -> None:
            self.goid = 0
            self.coro: Any = None  # Invariant: None exactly when status is IDLE or DEAD
            # The coroutine that ran the go statement, for "created by" in dumps; kept
            # after exit (a finished coroutine holds nothing) until the G is reused.
            self.creator: Any = None
            self.fn: Any = None  # the function started, for dumps
            self.status = IDLE
            self.waitreason = ""
            # The value handed to the G when it is next stepped (coro.send(param)).
            self.param: Any = None
            self.elem: Any = None  # value being sent while parked in a channel's sendq
            self.ok = True  # receive: False when woken by close; send: False = closed
            self.p: Any = None  # the P this G left for a syscall (exitsyscall prefers it)
            self.parent = 0  # goid of the creator, for "created by" in dumps
            self.selectdone = False  # Invariant: set once one of a select's cases fired

else:
    _GFields = speedups.GBase


class G(_GFields):
    """One goroutine's record. Fields are read and written by the scheduler and channels."""

    __slots__ = ()
    issel: bool = False  # class constant: a plain G waiting in a channel queue

    def __repr__(self) -> str:
        return f"<G {self.goid} {STATUS_NAMES[self.status]} {str(self.waitreason)!r}>"

    if DEBUG and not TYPE_CHECKING:
        _status_slot = _GFields.status  # the slot (or C member) the property guards

        @property
        def status(self) -> int:
            """Go's _G status"""  # the C member's doc (_speedups_records.c.h), word for word
            return G._status_slot.__get__(self)

        @status.setter
        def status(self, new: int) -> None:
            try:
                old = G._status_slot.__get__(self)
            except AttributeError:  # the record's first status, set by __init__
                pass
            else:
                casgstatus(self, old, new)
            G._status_slot.__set__(self, new)


def casgstatus(g: Any, old: int, new: int) -> None:
    """Go's ``casgstatus`` check: raise ``throw`` unless old -> new is in TRANSITIONS.

    Called for every status change when :data:`DEBUG` is on.
    """
    if (old, new) not in TRANSITIONS:
        raise throw(
            f"casgstatus: goroutine {g.goid}: bad transition "
            f"{STATUS_NAMES[old]} -> {STATUS_NAMES[new]}"
        )


class _PySudog:
    """A G queued on one channel for one case of a select (Go's sudog with isSelect).

    The pure-Python record; with the C accelerator built, :data:`Sudog` is its twin
    ``gosim._speedups.Sudog`` (same constructor and fields), whose fields the C channel
    code reads directly.
    """

    __slots__ = ("caseidx", "ch", "elem", "g", "ok")
    issel: bool = True

    def __init__(self, g: G, ch: Any, caseidx: int, elem: Any) -> None:
        self.g = g
        self.ch = ch
        self.caseidx = caseidx
        self.elem = elem
        self.ok = True


Sudog = _PySudog
if not TYPE_CHECKING and speedups is not None:
    Sudog = speedups.Sudog  # the C twin, read directly by the C channel code
