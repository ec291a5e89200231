"""The netpoller hook: how a network layer plugs its readiness source into the driver.

Go's scheduler asks the netpoller for goroutines whose I/O became ready: without
blocking in ``findRunnable`` (after the global queue, before stealing) and from
``sysmon``; blocking, with the earliest timer as deadline, when there is nothing else
to do. gosim does the same through this interface, implemented by ``gosim.net`` with one
``select.epoll`` (Linux), which the idle driver blocks in itself when nothing else can
wake it, and otherwise watches through trio:

``poll(to_global=False, timeout=0.0)``
    Ready every goroutine whose I/O can proceed; return how many. Called on the driver
    with the runtime current. Readied onto the current P (``rt.goready``), as Go's
    ``findRunnable`` does when its P has nothing else to run; with ``to_global``, at
    the tail of the global queue (``rt.globready``), as Go's ``sysmon`` does while
    every P is busy. ``timeout``: how long to block for the first event (seconds;
    ``math.inf``: until one), as Go's ``netpoll(delay)``; 0 does not block.
``waiters()``
    How many goroutines are parked on I/O now. Non-zero makes I/O a wake source, so
    the runtime is not deadlocked while a goroutine waits for the network.
``fileno()``
    A file descriptor that becomes readable when ``poll`` would find something; the
    idle driver waits on it with ``trio.lowlevel.wait_readable`` when a trio task (a
    syscall, a trio call, a caller of an open runtime) could wake it too.
``wakeup()``
    Make a ``poll`` blocked now, or the next one that blocks, return at once (Go's
    ``netpollBreak``). Called from any OS thread (a ``ThreadWake`` reaching a driver
    blocked in ``poll``), so it must be thread-safe, never block, and do nothing once
    the netpoller is closed.
"""

from __future__ import annotations

from typing import Protocol


class NetPoller(Protocol):
    def poll(self, to_global: bool = False, timeout: float = 0.0) -> int:
        """Ready every goroutine whose I/O can proceed, onto the current P (with
        ``to_global``, the global queue's tail); how many. ``timeout``: how long to block
        for the first event (``math.inf``: until one; 0: not at all)."""

    def waiters(self) -> int:
        """How many goroutines are parked on I/O now (non-zero: I/O can wake the runtime)."""

    def fileno(self) -> int:
        """A descriptor that is readable when I/O is ready, for the idle driver to wait on."""

    def wakeup(self) -> None:
        """Break a blocked (or the next blocking) ``poll``; from any thread (netpollBreak)."""
