"""The netpoller hook: how a network layer plugs its readiness source into the driver.

Go's scheduler asks the netpoller for goroutines whose I/O became ready: without
blocking in ``findRunnable`` (after the global queue, before stealing) and from
``sysmon``; blocking, with the earliest timer as deadline, when there is nothing else
to do. gosim does the same through this interface, implemented by ``gosim.net`` with one
``select.epoll`` (Linux) whose own fd trio watches while the driver idles:

``poll(to_global=False)``
    Without blocking, ready every goroutine whose I/O can proceed; return how many.
    Called on the driver with the runtime current. Readied onto the current P
    (``rt.goready``), as Go's ``findRunnable`` does when its P has nothing else to
    run; with ``to_global``, at the tail of the global queue (``rt.globready``), as
    Go's ``sysmon`` does while every P is busy.
``waiters()``
    How many goroutines are parked on I/O now. Non-zero makes I/O a wake source, so
    the runtime is not deadlocked while a goroutine waits for the network.
``fileno()``
    A file descriptor that becomes readable when ``poll`` would find something; the
    idle driver waits on it with ``trio.lowlevel.wait_readable``.
"""

from __future__ import annotations

from typing import Protocol


class NetPoller(Protocol):
    def poll(self, to_global: bool = False) -> int: ...

    def waiters(self) -> int: ...

    def fileno(self) -> int: ...
