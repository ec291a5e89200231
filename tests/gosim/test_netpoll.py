"""The netpoller hook: I/O readiness from an epoll wakes parked goroutines, and a
goroutine waiting on I/O is not a deadlock."""

from __future__ import annotations

import math
import os
import select
import signal
import socket
import threading
import time
from typing import Any

import pytest
import trio

import gosim
from gosim import lowlevel, net
from gosim.net._poll import NetPoller


class PipePoller:
    """A minimal netpoller over one epoll: goroutines park until their fd is readable."""

    def __init__(self) -> None:
        self.ep = select.epoll()
        self.parked: dict[int, Any] = {}
        self.polls = 0

    def fileno(self) -> int:
        return self.ep.fileno()

    def waiters(self) -> int:
        return len(self.parked)

    def wakeup(self) -> None:
        # Nothing in these tests settles from another thread: a break would be a bug.
        raise AssertionError("PipePoller.wakeup: unexpected in these tests")

    def poll(self, to_global: bool = False, timeout: float = 0.0) -> int:
        self.polls += 1
        rt = lowlevel.current_runtime()
        goready = rt.globready if to_global else rt.goready
        n = 0
        for fd, _ in self.ep.poll(-1 if timeout == math.inf else timeout):
            g = self.parked.pop(fd)
            self.ep.unregister(fd)
            goready(g, fd)
            n += 1
        return n

    async def wait_readable(self, fd: int) -> int:
        self.parked[fd] = lowlevel.current_g()
        self.ep.register(fd, select.EPOLLIN)
        got: int = await lowlevel.park(lowlevel.WaitReason.IO_WAIT)
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


def test_io_readied_while_the_p_is_busy_queues_behind_the_global_queue() -> None:
    """Go's sysmon readies I/O goroutines at the tail of the global queue (injectglist
    without a P). gosim's periodic netpoll does the same: goroutines that a full local
    queue spilled to the global queue before the I/O arrived run before the I/O's
    readers, however long the local queue keeps itself busy. (Readied onto the busy P
    instead, every new I/O event would pass them, and under sustained load they would
    wait for seconds: how a server under load once let heartbeats go unanswered.)"""
    conns = 8

    async def main() -> tuple[list[int], set[int], set[int]]:
        rt = lowlevel.current_runtime()
        order: list[int] = []  # goids, in the order of their first step after the setup
        ln = net.listen("tcp", "127.0.0.1:0")
        clients = [await net.dial("tcp", ln.addr()) for _ in range(conns)]
        servers = [await ln.accept() for _ in range(conns)]
        readers: set[int] = set()

        async def reader(c: net.Conn) -> None:
            readers.add(lowlevel.current_g().goid)
            await c.read(1)
            order.append(lowlevel.current_g().goid)

        for c in servers:
            gosim.go(reader, c)
        await gosim.sleep(0.01)  # every reader parked on its socket

        # A ring that keeps the local queue full: 300 tokens hop along 400 goroutines
        # over unbuffered channels, each hop readying the receiver (runnext) and
        # pushing the last one to the local queue's tail, which spills to the global
        # queue when full. The P never runs dry, so only the periodic netpoll can see
        # the readers' input.
        ring = [gosim.Chan[int]() for _ in range(400)]
        done = gosim.Chan[None](300)

        async def hop(i: int) -> None:
            order.append(lowlevel.current_g().goid)
            while True:
                hops, ok = await ring[i].recv2()
                if not ok:
                    return
                assert hops is not None
                if hops:
                    await ring[(i + 1) % len(ring)].send(hops - 1)
                else:
                    await done.send(None)

        for i in range(len(ring)):
            gosim.go(hop, i)
        spilled = {g.goid for g in rt.globrunq}
        for c in clients:
            await c.write(b"x")  # every reader's input is in its socket now

        async def feed() -> None:
            for i in range(300):
                await ring[i].send(100)

        gosim.go(feed)
        for _ in range(300):
            await done.recv()
        for ch in ring:
            ch.close()
        for c in clients + servers:
            c.close()
        ln.close()
        return order, spilled, readers

    order, spilled, readers = gosim.run(main, procs=1)
    assert spilled, "the setup did not spill goroutines to the global queue"
    first = {goid: i for i, goid in reversed(list(enumerate(order)))}
    assert readers <= first.keys(), "a reader never got its input"
    last_spilled = max(first[g] for g in spilled)
    first_reader = min(first[g] for g in readers)
    assert last_spilled < first_reader, (
        f"I/O readers overtook goroutines waiting in the global queue "
        f"(first reader at step {first_reader}, last spilled at {last_spilled})"
    )


def _echo_rounds(rounds: int) -> None:
    """A client and a server goroutine exchange ``rounds`` messages over 127.0.0.1,
    each side parking on its socket between them; a sleeper adds timers to wait for."""

    async def main() -> None:
        ln = net.listen("tcp", "127.0.0.1:0")
        client = await net.dial("tcp", ln.addr())
        server = await ln.accept()

        async def echo() -> None:
            for _ in range(rounds):
                await server.write(await server.read(1))

        gosim.go(echo)
        for i in range(rounds):
            await client.write(b"%d" % (i % 10))
            assert await client.read(1) == b"%d" % (i % 10)
            if i % 10 == 0:
                await gosim.sleep(0.001)  # an idle with a timer as its deadline
        client.close()
        server.close()
        ln.close()

    gosim.run(main, procs=2)


def test_the_idle_driver_blocks_in_the_netpoller_not_in_trio(monkeypatch: Any) -> None:
    """Under gosim.run with no syscall or trio call in flight, the idle driver waits in
    the netpoller itself (Go's netpoll(delay)): not one trio wait per idle."""
    waits = []
    real = trio.lowlevel.wait_readable

    async def counted(fd: Any) -> None:
        waits.append(fd)
        await real(fd)

    monkeypatch.setattr(trio.lowlevel, "wait_readable", counted)
    _echo_rounds(200)
    assert waits == []


def test_the_idle_driver_waits_through_trio_while_a_syscall_can_wake_it(monkeypatch: Any) -> None:
    """A syscall in flight can wake a goroutine through trio: the idle driver then waits
    on the netpoller's fd through trio, and both the syscall's and the I/O's goroutines
    wake."""
    waits = []
    real = trio.lowlevel.wait_readable

    async def counted(fd: Any) -> None:
        waits.append(fd)
        await real(fd)

    monkeypatch.setattr(trio.lowlevel, "wait_readable", counted)

    async def main() -> tuple[str, bytes]:
        ln = net.listen("tcp", "127.0.0.1:0")
        client = await net.dial("tcp", ln.addr())
        server = await ln.accept()
        got = gosim.Chan[bytes](1)

        async def read() -> None:
            await got.send(await server.read(1))

        gosim.go(read)

        async def late_write() -> None:
            await gosim.sleep(0.05)
            await client.write(b"x")

        gosim.go(late_write)
        slept = await gosim.syscall(lambda: (time.sleep(0.1), "slept")[1])
        data = await got.recv()
        for c in (client, server, ln):
            c.close()
        return slept, data

    assert gosim.run(main, procs=1) == ("slept", b"x")
    assert waits  # the reader parked while the syscall was in flight


@pytest.mark.parametrize("taken_by", ["the main thread", "another thread"])
def test_ctrl_c_reaches_a_driver_blocked_in_the_netpoller(taken_by: str) -> None:
    """SIGINT while the driver blocks in the netpoller (a goroutine waits on a socket
    that stays silent): gosim.run raises KeyboardInterrupt, as it would anywhere else in
    the program, also when the kernel hands the signal to another thread (the main
    thread's wait is then not interrupted: it wakes within IDLE_TRIO_INTERVAL and runs
    the handler). Should the interrupt wait for another wake-up, a byte sent 20 s later
    brings one, and the test fails instead of hanging."""
    with socket.create_server(("127.0.0.1", 0)) as plain:
        port = plain.getsockname()[1]

        async def main() -> None:
            conn = await net.dial("tcp", f"127.0.0.1:{port}")
            try:
                await conn.read(1)  # silent until the fallback byte
            finally:
                conn.close()

        fallback = threading.Event()

        def interrupt_then_fallback() -> None:
            peer, _ = plain.accept()
            with peer:
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGINT)  # to the process: any thread may take it
                time.sleep(20)
                fallback.set()
                peer.sendall(b"x")

        # Python's own SIGINT handling, as a program started from a terminal has it (a
        # process started in the background of a script inherits SIGINT ignored: CI's
        # parallel passes do), which trio builds its KeyboardInterrupt on.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        helper = threading.Thread(target=interrupt_then_fallback, daemon=True)
        helper.start()  # before the mask below: this thread may take SIGINT
        if taken_by == "another thread":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            gosim.run(main, procs=1)
        except KeyboardInterrupt:
            # While the socket was silent: not brought by the fallback byte's wake-up.
            assert not fallback.is_set()
        else:
            raise AssertionError("KeyboardInterrupt did not reach gosim.run")
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            signal.signal(signal.SIGINT, previous)


def test_a_timer_due_after_the_idle_drivers_trio_turn_fires(monkeypatch: Any) -> None:
    """The idle driver gives trio a turn every IDLE_TRIO_INTERVAL, then blocks in the
    netpoller until the earliest timer. When that turn takes longer than the timer had
    left, the deadline has passed: the driver must look again, not hand the poller a
    negative wait (which epoll reads as "no limit": the run hung until I/O arrived,
    and here, a sleeping reader and a writer facing a full socket, none would).

    The turn is made slow on purpose; every wait the poller is given is recorded. A
    byte sent 20 s later is the fallback should the run block anyway: the test then
    fails instead of hanging."""
    timeouts: list[float] = []
    real_poll = NetPoller.poll

    def recording_poll(self: NetPoller, to_global: bool = False, timeout: float = 0.0) -> int:
        timeouts.append(timeout)
        return real_poll(self, to_global, timeout)

    real_checkpoint = trio.lowlevel.checkpoint

    async def slow_checkpoint() -> None:
        time.sleep(0.3)  # longer than the sleep below has left: its timer is then due
        await real_checkpoint()

    monkeypatch.setattr(NetPoller, "poll", recording_poll)
    monkeypatch.setattr(trio.lowlevel, "checkpoint", slow_checkpoint)
    fallback = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as plain:
        port = plain.getsockname()[1]

        def fallback_byte() -> None:
            peer, _ = plain.accept()
            with peer:
                if not done.wait(20):
                    fallback.set()
                    peer.sendall(b"x")

        async def main() -> str:
            conn = await net.dial("tcp", f"127.0.0.1:{port}")

            async def silent_reader() -> None:
                try:
                    await conn.read(1)  # a goroutine waiting on I/O for the whole run
                except net.ClosedError:
                    pass

            gosim.go(silent_reader)
            await gosim.sleep(0.2)
            conn.close()
            return "woke"

        done = threading.Event()
        helper = threading.Thread(target=fallback_byte, daemon=True)
        helper.start()
        try:
            assert gosim.run(main, procs=2) == "woke"
        finally:
            done.set()
            helper.join()
    assert not fallback.is_set()
    assert timeouts and min(timeouts) >= 0.0, sorted(timeouts)[:3]


def test_the_netpoller_reads_a_passed_deadline_as_do_not_block() -> None:
    """NetPoller.poll given a negative timeout (a deadline already passed) returns at
    once instead of waiting for I/O without limit, as epoll would read it."""
    seen: list[float] = []

    class RecordingEpoll:
        def poll(self, timeout: float = -1) -> list[tuple[int, int]]:
            seen.append(timeout)
            return []

        def close(self) -> None:
            pass

    poller = NetPoller()
    real_ep = poller.ep
    poller.ep = RecordingEpoll()  # type: ignore[assignment]
    try:
        assert poller.poll(False, -0.25) == 0
        assert poller.poll(False, 0.01) == 0
        assert poller.poll(False, math.inf) == 0
    finally:
        poller.ep = real_ep
        poller.close()
    assert seen == [0.0, 0.01, -1]
