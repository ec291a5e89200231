"""ThreadWake: another OS thread settles a goroutine's Waiter, whichever way the driver
waits (blocked in the netpoller, in trio, busy), with no wake-up lost and no deadlock
reported while the thread works."""

from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any

import pytest
import trio
import trio.testing

import gosim
import gosim.time
from gosim import lowlevel, net, sync
from gosim._core import _schedule
from gosim._core._exceptions import NotInRuntime
from gosim.lowlevel import ThreadWake, Waiter, WaitReason
from gosim.net._poll import NetPoller, netpoller

WAIT = WaitReason.WAITER


@pytest.fixture
def no_idle_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver blocked in the netpoller wakes only for a reason: without its periodic
    tick (every 50 ms), a settle whose wake-up was lost leaves it blocked for good."""
    monkeypatch.setattr(_schedule, "IDLE_TRIO_INTERVAL", 3600.0)


def _run_bounded(main: Any, **kwargs: Any) -> Any:
    """gosim.run(main) on a thread of its own: a lost wake-up fails the test (the run
    would never end) instead of hanging the suite."""
    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(gosim.run(main, **kwargs)), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "a settle from another thread never woke the driver"
    return result[0]


def _settle_later(wake: ThreadWake, value: Any, delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        wake.settle(value)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def _wait_for_thread(delay: float, value: Any) -> tuple[Any, threading.Thread]:
    waiter = Waiter()
    thread = _settle_later(ThreadWake(waiter), value, delay)
    return await waiter.wait(WAIT), thread


@pytest.mark.parametrize("with_netpoller", [False, True])
@pytest.mark.usefixtures("no_idle_tick")
def test_a_thread_wakes_a_goroutine_and_the_wait_is_no_deadlock(with_netpoller: bool) -> None:
    # Every goroutine waits for the thread: only the ThreadWake can wake one. With a
    # netpoller (and nothing registered on it) the idle driver blocks in its poll, which
    # the settle breaks; without one it waits in trio, which the settle's token wakes.
    async def main() -> tuple[Any, int]:
        if with_netpoller:
            netpoller()
        got, thread = await _wait_for_thread(0.05, "done")
        thread.join()
        return got, lowlevel.current_runtime().syscalls.thread_waits

    got, outstanding = _run_bounded(main, procs=2)
    assert got == "done"
    assert outstanding == 0


def test_a_blocked_poll_is_broken_by_wakeup_from_another_thread() -> None:
    # Without the break the poll would block forever: nothing else is registered.
    async def main() -> int:
        poller = NetPoller()
        try:
            timer = threading.Timer(0.05, poller.wakeup)
            timer.start()
            woken = poller.poll(False, math.inf)
            timer.join()
            # The break was read: the next poll does not return at once for it.
            again = poller.poll(False, 0.0)
            return woken + again
        finally:
            poller.close()

    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(gosim.run(main, procs=1)))
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the poll was not broken"
    assert result == [0]


def test_wakeup_after_close_does_nothing() -> None:
    poller = NetPoller()
    poller.close()
    poller.wakeup()  # the eventfd is closed: no write to a number reused meanwhile


@pytest.mark.usefixtures("no_idle_tick")
def test_many_settles_racing_the_driver_going_idle_are_all_taken() -> None:
    # One thread settles 2,000 waits as fast as the goroutines hand them over, so that
    # settles land on every side of the driver's last look before it blocks; every
    # goroutine must get its own value (a lost wake-up would leave the driver blocked,
    # a wrong hand-over the wrong value).
    rounds = 2_000

    async def main() -> list[int]:
        netpoller()
        hand: queue.SimpleQueue[tuple[ThreadWake, int] | None] = queue.SimpleQueue()

        def settler() -> None:
            while (item := hand.get()) is not None:
                item[0].settle(item[1])

        thread = threading.Thread(target=settler)
        thread.start()
        got: list[int] = []
        try:
            for i in range(rounds):
                waiter = Waiter()
                hand.put((ThreadWake(waiter), i))
                got.append(await waiter.wait(WAIT))
        finally:
            hand.put(None)
            thread.join()
        return got

    assert _run_bounded(main, procs=2) == list(range(rounds))


def test_settles_from_several_threads_wake_their_own_goroutines() -> None:
    async def main() -> dict[int, Any]:
        netpoller()
        results: dict[int, Any] = {}
        threads: list[threading.Thread] = []
        wg = sync.WaitGroup()

        async def one(i: int) -> None:
            waiter = Waiter()
            threads.append(_settle_later(ThreadWake(waiter), i * 10, 0.001 * (i % 7)))
            results[i] = await waiter.wait(WAIT)
            wg.done()

        for i in range(50):
            wg.add(1)
            gosim.go(one, i)
        await wg.wait()
        for t in threads:
            t.join()
        return results

    assert gosim.run(main, procs=4) == {i: i * 10 for i in range(50)}


def test_a_settle_while_the_driver_is_busy_is_taken_between_goroutines() -> None:
    async def main() -> Any:
        waiter = Waiter()
        thread = _settle_later(ThreadWake(waiter), "late", 0.0)
        thread.join()  # settled before anything idles: the driver finds it when it looks
        spins = 0
        while not waiter.done():
            await gosim.gosched()
            spins += 1
            assert spins < 1_000_000
        return waiter.result()

    assert gosim.run(main, procs=1) == "late"


@pytest.mark.parametrize("with_netpoller", [False, True])
def test_under_an_open_runtime_the_trio_wait_is_woken(with_netpoller: bool) -> None:
    # The driver of an open runtime waits in trio: on the netpoller's descriptor when
    # there is one (the settle breaks the netpoller), else on its cancel scope (the
    # settle goes through trio's token).
    async def waits_for_thread() -> Any:
        if with_netpoller:
            netpoller()
        got, thread = await _wait_for_thread(0.05, 7)
        thread.join()
        return got

    async def body() -> Any:
        async with lowlevel.open_runtime(procs=2) as rt:
            return await rt.call(waits_for_thread)

    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(trio.run(body)), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "a settle from another thread never woke the driver"
    assert result == [7]


def test_settle_twice_is_refused_and_outside_a_runtime_it_cannot_be_made() -> None:
    async def main() -> None:
        waiter = Waiter()
        wake = ThreadWake(waiter)
        wake.settle(1)
        with pytest.raises(RuntimeError, match="settled already"):
            wake.settle(2)
        assert await waiter.wait(WAIT) == 1

    gosim.run(main, procs=1)
    with pytest.raises(NotInRuntime):
        ThreadWake(Waiter())


def test_a_settle_after_the_runtime_ended_does_nothing() -> None:
    kept: list[ThreadWake] = []

    async def main() -> None:
        netpoller()
        waiter = Waiter()
        kept.append(ThreadWake(waiter))
        waiter.settle("not the thread")  # the goroutine needs no thread to end

    gosim.run(main, procs=1)
    kept[0].settle("too late")  # its runtime and netpoller are gone: no error


def test_a_virtual_clock_does_not_jump_while_a_thread_works() -> None:
    # A sleeper's 30 virtual seconds would pass at once if the clock jumped while the
    # other goroutine waits for its thread; held, the thread's settle comes first.
    async def main() -> list[str]:
        order: list[str] = []
        done = sync.WaitGroup()
        done.add(1)

        async def sleeper() -> None:
            await gosim.time.sleep(30)
            order.append("slept")
            done.done()

        gosim.go(sleeper)
        got, thread = await _wait_for_thread(0.05, "thread")
        thread.join()
        order.append(got)
        await done.wait()
        return order

    assert gosim.run(main, procs=2, virtual_time=True) == ["thread", "slept"]


def test_the_thread_wake_is_reachable_through_net_layers() -> None:
    # A goroutine parked on a socket and one parked on a ThreadWake: both wake, each
    # through its own source, on one driver blocked in the netpoller.
    async def main() -> tuple[bytes, Any]:
        ln = net.listen("tcp", "127.0.0.1:0")
        got: dict[str, Any] = {}
        done = sync.WaitGroup()
        done.add(2)

        async def reader() -> None:
            conn = await ln.accept()
            got["bytes"] = await conn.read(16)
            conn.close()
            done.done()

        async def thread_waiter() -> None:
            value, thread = await _wait_for_thread(0.02, "woken")
            thread.join()
            got["thread"] = value
            done.done()

        gosim.go(reader)
        gosim.go(thread_waiter)
        client = await net.dial("tcp", ln.addr())
        await client.write(b"hello")
        await done.wait()
        client.close()
        ln.close()
        return got["bytes"], got["thread"]

    assert gosim.run(main, procs=2) == (b"hello", "woken")


def test_a_thread_wake_left_outstanding_gives_back_the_virtual_clock() -> None:
    # The enclosing trio program's MockClock jumps by itself; a goroutine still waiting
    # on its thread when the runtime ends must not leave that clock held.
    clock = trio.testing.MockClock(autojump_threshold=0)
    release = threading.Event()
    held_during: list[float] = []

    async def leaves_a_waiter() -> None:
        async def waits_for_a_thread() -> None:
            waiter = Waiter()
            wake = ThreadWake(waiter)
            threading.Thread(target=lambda: (release.wait(30), wake.settle(None))).start()
            await waiter.wait(WAIT)

        gosim.go(waits_for_a_thread)
        await gosim.gosched()  # it makes its ThreadWake and parks
        held_during.append(clock.autojump_threshold)

    async def body() -> float:
        async with lowlevel.open_runtime(procs=1) as rt:
            await rt.call(leaves_a_waiter)
        return clock.autojump_threshold

    try:
        after = trio.run(body, clock=clock)
    finally:
        release.set()
    assert held_during == [math.inf]
    assert after == 0
