"""The netpoller: one edge-triggered ``select.epoll`` per runtime (Go's ``netpoll_epoll.go``).

Every socket gosim.net opens is non-blocking and registered once, for input, output and
peer hang-up, edge-triggered (``EPOLLET``), as Go registers its fds. An operation first
tries the system call; only on ``EAGAIN`` does the goroutine park on the socket's
:class:`PollDesc` (wait reason ``IO wait``). The driver calls :meth:`NetPoller.poll`
without blocking from ``findrunnable`` and every few hundred switches; when nothing else
can run it blocks in it (the earliest timer its deadline), or, while a trio task could
wake the driver too, waits on the epoll fd through trio.

Edge triggering means an event may arrive while nobody waits (the goroutine is busy
between its ``EAGAIN`` and its park, or has not read yet): the descriptor then remembers
the readiness (``READY``) and the next wait returns at once, as Go's ``pdReady`` state
does. A spurious wake-up is harmless: the caller retries the system call.

Another OS thread breaks a blocked poll with :meth:`NetPoller.wakeup` (Go's
``netpollBreak``): an ``eventfd`` in the epoll, written at most once until a poll has
read it (Go's ``netpollWakeSig``), which is how a ``ThreadWake`` reaches a driver
blocked here.

Deadlines are runtime timers that wake the parked goroutine with ``TIMEOUT``; closing
wakes it with ``CLOSED``. Each side (read, write) has at most one waiter: a second
goroutine reading the same connection at once is refused by the connection (busy).
"""

from __future__ import annotations

import math
import os
import select
import threading
import types
from collections.abc import Generator
from typing import Any, Final

from gosim import _internals, lowlevel
from gosim._core._exceptions import NotInRuntime
from gosim.lowlevel import RuntimeTimer, WaitReason

READY: Final = "ready"  # an edge arrived with nobody waiting
TIMEOUT: Final = "timeout"
CLOSED: Final = "closed"

_IO_WAIT: Final = WaitReason.IO_WAIT
_IN = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
_OUT = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


class PollDesc:
    """Readiness state of one socket: who waits to read, who waits to write."""

    __slots__ = (
        "closing",
        "fd",
        "hangup",
        "owner",
        "poller",
        "rdeadline",
        "rg",
        "rtimer",
        "wdeadline",
        "wg",
        "wtimer",
    )

    def __init__(self, poller: NetPoller, fd: int) -> None:
        self.poller = poller
        self.fd = fd
        # rg/wg: None (nothing), READY (an edge is pending) or the parked G.
        self.rg: Any = None
        self.wg: Any = None
        self.rdeadline = 0.0  # 0 = none; else absolute runtime-clock time
        self.wdeadline = 0.0
        self.rtimer: RuntimeTimer | None = None
        self.wtimer: RuntimeTimer | None = None
        self.closing = False
        # Sticky: the peer closed or the socket failed. One edge can carry the last
        # data and the end of stream together, so a read that drained the data still
        # has an end of stream (or an error) to read without any further edge.
        self.hangup = False
        self.owner: Any = None  # the socket, closed if the runtime ends first

    @types.coroutine
    def wait(self, mode: str) -> Generator[Any, Any, str | None]:
        """Park until ready (None), the deadline passes (TIMEOUT) or the fd closes (CLOSED).

        A generator-based coroutine that parks with one bare yield to the driver, as
        the channel operations do: every read and write of a busy server passes here.
        """
        if self.closing:
            return CLOSED
        reading = mode == "r"
        state = self.rg if reading else self.wg
        if state is READY:
            if reading:
                self.rg = None
            else:
                self.wg = None
            return None
        deadline = self.rdeadline if reading else self.wdeadline
        if deadline and deadline <= lowlevel.current_runtime().now():
            return TIMEOUT
        if state is not None:
            raise RuntimeError("netpoll: two goroutines wait on one side of a socket")
        rt = _internals.state.rt
        g = None if rt is None else rt.curg
        if g is None:
            raise NotInRuntime("not inside a gosim goroutine")
        if reading:
            self.rg = g
        else:
            self.wg = g
        self.poller.nwaiters += 1
        g.waitreason = _IO_WAIT
        why: str | None = yield _internals.PARK
        return why

    def _wake(self, slot: str, value: Any) -> bool:
        state = getattr(self, slot)
        if state is None or state is READY:
            if value is None:
                setattr(self, slot, READY)
            return False
        setattr(self, slot, None)
        self.poller.nwaiters -= 1
        lowlevel.ready(state, value)
        return True

    def set_deadline(self, mode: str, when: float) -> None:
        """Arm (or clear, with 0) the read or write deadline; a parked waiter sees it."""
        rt = lowlevel.current_runtime()
        for m in mode:
            timer = self.rtimer if m == "r" else self.wtimer
            if timer is not None:
                rt.timers.delete(timer)
            if m == "r":
                self.rdeadline = when
            else:
                self.wdeadline = when
            if when:
                timer = RuntimeTimer(_deadline_fired, (self, "rg" if m == "r" else "wg"))
                rt.timers.add(timer, when)
                if m == "r":
                    self.rtimer = timer
                else:
                    self.wtimer = timer

    def close(self) -> None:
        """Wake both waiters with CLOSED and forget the fd (the caller closes the socket)."""
        if self.closing:
            return
        self.closing = True
        rt = lowlevel.current_runtime()
        for timer in (self.rtimer, self.wtimer):
            if timer is not None:
                rt.timers.delete(timer)
        self._wake("rg", CLOSED)
        self._wake("wg", CLOSED)
        self.poller.unregister(self)


def _deadline_fired(arg: tuple[PollDesc, str], now: float) -> None:
    pd, slot = arg
    pd._wake(slot, TIMEOUT)


class NetPoller:
    """The runtime's epoll; implements gosim's netpoller hook (``_core._netpoll``)."""

    def __init__(self) -> None:
        self.ep = select.epoll()
        self.descs: dict[int, PollDesc] = {}
        self.nwaiters = 0
        # The break (wakeup): level-triggered, never among descs. Its lock orders a
        # thread's write against close, which could hand the number to another file.
        self._break_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.ep.register(self._break_fd, select.EPOLLIN)
        self._break_lock = threading.Lock()
        self._break_pending = False

    # The hook.
    def fileno(self) -> int:
        return self.ep.fileno()

    def waiters(self) -> int:
        return self.nwaiters

    def poll(self, to_global: bool = False, timeout: float = 0.0) -> int:
        # select.epoll reads any negative timeout as "no limit" and rounds a positive one
        # up to milliseconds: a deadline that passed meanwhile must mean "do not block".
        events = self.ep.poll(-1 if timeout == math.inf else max(timeout, 0.0))
        if not events:
            return 0
        woken = 0
        descs = self.descs
        rt = _internals.state.rt  # poll runs on the driver, inside the runtime
        if rt is None:
            raise NotInRuntime("netpoll: not inside a gosim runtime")
        goready = rt.globready if to_global else rt.goready
        for fd, ev in events:
            pd = descs.get(fd)
            if pd is None:
                if fd == self._break_fd:
                    self._read_break()
                continue
            if ev & _HANGUP:
                pd.hangup = True
            # _wake inlined for both sides: this loop runs for every readiness edge.
            if ev & _IN:
                g = pd.rg
                if g is None or g is READY:
                    pd.rg = READY
                else:
                    pd.rg = None
                    self.nwaiters -= 1
                    goready(g, None)
                    woken += 1
            if ev & _OUT:
                g = pd.wg
                if g is None or g is READY:
                    pd.wg = READY
                else:
                    pd.wg = None
                    self.nwaiters -= 1
                    goready(g, None)
                    woken += 1
        return woken

    def wakeup(self) -> None:
        """Make the poll blocked now, or the next one that blocks, return at once; from
        any thread, never blocking. Nothing after :meth:`close`."""
        with self._break_lock:
            if self._break_pending or self._break_fd < 0:
                return
            self._break_pending = True
            os.eventfd_write(self._break_fd, 1)

    def _read_break(self) -> None:
        with self._break_lock:
            self._break_pending = False
            try:
                os.eventfd_read(self._break_fd)
            except BlockingIOError:  # read by an earlier poll already
                pass

    def close(self) -> None:
        """The runtime ended: close every socket still open (as process exit would)."""
        for pd in list(self.descs.values()):
            if pd.owner is not None:
                pd.owner.close()
        self.descs.clear()
        self.ep.close()
        with self._break_lock:
            os.close(self._break_fd)
            self._break_fd = -1

    # Registration.
    def register(self, fd: int) -> PollDesc:
        pd = PollDesc(self, fd)
        self.descs[fd] = pd
        self.ep.register(fd, _IN | _OUT | select.EPOLLET)
        return pd

    def unregister(self, pd: PollDesc) -> None:
        if self.descs.pop(pd.fd, None) is not None:
            try:
                self.ep.unregister(pd.fd)
            except (OSError, ValueError):
                pass  # already closed by the kernel side


def netpoller() -> NetPoller:
    """The running runtime's netpoller, installed on first use."""
    np_ = lowlevel.netpoller()
    if np_ is None:
        np_ = NetPoller()
        lowlevel.set_netpoller(np_)
    assert isinstance(np_, NetPoller)
    return np_
