"""The netpoller hook: I/O readiness from an epoll wakes parked goroutines, and a
goroutine waiting on I/O is not a deadlock."""

from __future__ import annotations

import os
import select
import threading
import time

import gosim
from gosim import lowlevel


class PipePoller:
    """A minimal netpoller over one epoll: goroutines park until their fd is readable."""

    def __init__(self) -> None:
        self.ep = select.epoll()
        self.parked: dict[int, lowlevel.G] = {}
        self.polls = 0

    def fileno(self) -> int:
        return self.ep.fileno()

    def waiters(self) -> int:
        return len(self.parked)

    def poll(self) -> int:
        self.polls += 1
        n = 0
        for fd, _ in self.ep.poll(0):
            g = self.parked.pop(fd)
            self.ep.unregister(fd)
            lowlevel.ready(g, fd)
            n += 1
        return n

    async def wait_readable(self, fd: int) -> int:
        self.parked[fd] = lowlevel.current_g()
        self.ep.register(fd, select.EPOLLIN)
        got: int = await lowlevel.park("IO wait")
        return got


def test_goroutine_parked_on_io_is_woken_by_the_netpoller() -> None:
    r, w = os.pipe()
    # A thread the runtime knows nothing about writes later: only the netpoller can
    # tell the runtime that the goroutine will wake, so this is not a deadlock.
    writer = threading.Thread(target=lambda: (time.sleep(0.05), os.write(w, b"x")))

    async def main() -> tuple[int, bytes, str]:
        poller = PipePoller()
        lowlevel.set_netpoller(poller)
        writer.start()
        fd = await poller.wait_readable(r)
        data = os.read(fd, 1)
        dump = gosim.lowlevel.current_runtime().goroutine_dump()
        return fd, data, dump

    try:
        fd, data, _ = gosim.run(main, procs=1)
    finally:
        writer.join()
        os.close(r)
        os.close(w)
    assert fd == r and data == b"x"


def test_io_waiter_shows_in_dump_and_deadlock_still_detected_without_waiters() -> None:
    async def blocked() -> None:
        await gosim.Chan[int]().recv()

    async def main() -> None:
        lowlevel.set_netpoller(PipePoller())  # installed but nobody waits on I/O
        await blocked()

    try:
        gosim.run(main, procs=1)
    except gosim.Deadlock as exc:
        assert "goroutine 1 [chan receive]:" in str(exc)
    else:
        raise AssertionError("expected a deadlock")
