"""A goroutine that leaves a park by an exception leaves the wait queue it was on.

The locks, Cond, WaitGroup, Once, Semaphore and the simulated network park through their
own wait queues (``lowlevel.park_in``). When the park ends without a wake (an exception
thrown into the goroutine, its coroutine closed), the entry must go, as the channels'
does: else a later unlock, signal or arriving segment hands off to a goroutine that has
gone on to wait elsewhere (and a starving Mutex hands it the lock, which is then lost).
Each test throws into a parked goroutine as the driver would step it, lets it wait on
another channel, then does the operation that would wake it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import gosim
from gosim import Chan, go, lowlevel, net
from gosim.sync import Cond, Mutex, Once, RWMutex, Semaphore, WaitGroup


class _Interrupt(Exception):
    pass


def _step_with_throw(g: Any, exc: BaseException) -> Any:
    """Throw exc into parked goroutine g as the driver steps one (rt.curg is g meanwhile)."""
    rt = lowlevel.current_runtime()
    me = rt.curg
    rt.curg = g
    try:
        return g.coro.throw(exc)
    finally:
        rt.curg = me


async def _interrupted_waiter(
    park: Callable[[], Awaitable[Any]], wake: Callable[[], Any], settle: float = 0.0
) -> list[Any]:
    """Park a goroutine with park(), throw into it, then wake(): what did it see?"""
    after: Chan[int] = Chan(0)
    got: list[Any] = []
    box: list[Any] = []

    async def waiter() -> None:
        box.append(lowlevel.current_g())
        try:
            await park()
        except _Interrupt:
            got.append("interrupted")
        got.append(await after.recv())

    go(waiter)
    await gosim.gosched()  # the waiter parks
    assert box[0].status == 4  # waiting
    assert _step_with_throw(box[0], _Interrupt()) == "park"  # now parked on `after`
    wake()
    if settle:
        await gosim.sleep(settle)
    await gosim.gosched()
    await gosim.gosched()
    await after.send(9)
    await gosim.gosched()
    return got


def test_mutex_unlock_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> tuple[list[Any], bool]:
        mu = Mutex()
        await mu.lock()
        got = await _interrupted_waiter(mu.lock, mu.unlock)
        return got, mu.try_lock()  # nobody took the lock on the departed waiter's behalf

    assert gosim.run(main, procs=1) == (["interrupted", 9], True)


def test_a_starving_mutex_does_not_hand_the_lock_to_a_waiter_that_left() -> None:
    async def main() -> tuple[list[Any], bool, int]:
        mu = Mutex()
        await mu.lock()
        mu._starving = True  # type: ignore[attr-defined] # the handoff path
        got = await _interrupted_waiter(mu.lock, mu.unlock)
        return got, mu.locked(), len(mu._waiters)  # type: ignore[attr-defined]

    assert gosim.run(main, procs=1) == (["interrupted", 9], False, 0)


@pytest.mark.parametrize("kind", ["rlock", "lock"])
def test_rwmutex_unlock_does_not_wake_a_waiter_that_left(kind: str) -> None:
    async def main() -> tuple[list[Any], bool]:
        rw = RWMutex()
        await rw.lock()
        got = await _interrupted_waiter(getattr(rw, kind), rw.unlock)
        return got, rw.try_lock()  # free: no reader or writer was counted in

    assert gosim.run(main, procs=1) == (["interrupted", 9], True)


def test_cond_signal_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> list[Any]:
        mu = Mutex()
        cond = Cond(mu)

        async def wait() -> None:
            await mu.lock()
            await cond.wait()

        return await _interrupted_waiter(wait, cond.signal)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


def test_waitgroup_done_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> list[Any]:
        wg = WaitGroup()
        wg.add(1)
        return await _interrupted_waiter(wg.wait, wg.done)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


def test_once_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> list[Any]:
        once = Once()
        release: Chan[None] = Chan(0)

        async def slow() -> None:
            await release.recv()

        go(once.do, slow)
        await gosim.gosched()  # the first caller runs slow and waits in it

        async def second() -> None:
            await once.do(slow)

        def finish() -> None:
            assert release.try_send(None)

        return await _interrupted_waiter(second, finish)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


def test_semaphore_release_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> tuple[list[Any], bool]:
        sem = Semaphore(1)
        await sem.acquire()
        got = await _interrupted_waiter(sem.acquire, sem.release)
        return got, sem.try_acquire()  # the unit was not granted to the departed waiter

    assert gosim.run(main, procs=1) == (["interrupted", 9], True)


def test_sim_network_data_does_not_wake_a_reader_that_left() -> None:
    async def main() -> list[Any]:
        net.use_sim_network(net.SimNetwork(seed=1, latency=(0.001, 0.002)))
        ln = net.listen("sim", "server:1")
        accepted: Chan[Any] = Chan(1)

        async def accept() -> None:
            await accepted.send(await ln.accept())

        go(accept)
        client = await net.dial("sim", "server:1", local_host="c")
        server = await accepted.recv()
        assert server is not None

        async def read() -> None:
            await server.read(100)

        def write() -> None:
            go(client.write, b"hello")

        got = await _interrupted_waiter(read, write, settle=0.1)
        got.append(await server.read(100))  # the data waited for the next reader
        client.close()
        server.close()
        ln.close()
        return got

    assert gosim.run(main, procs=1, seed=1, virtual_time=True) == ["interrupted", 9, b"hello"]
