"""The scheduler's semantics with several Ps, as Go's: work is stolen, the global queue
is served every 61 ticks, nobody starves, and idle Ps stay idle until work comes.

Each test runs on whichever implementation the process has (the C inner loop, or the
pure-Python reference under ``GOSIM_PURE_PYTHON=1``; CI runs the suite both ways), at
several ``procs``, real time unless the test says otherwise.
"""

from __future__ import annotations

import time

import pytest

import gosim
from gosim import Chan, go
from gosim.lowlevel import current_runtime

FAIRNESS_TICKS = 61  # Go's schedule: the global queue first every 61st tick of a P

PROCS = [2, 4, 8, 64]


def _switches() -> int:
    return gosim.statistics().context_switches


@pytest.mark.parametrize("procs", PROCS)
def test_queued_goroutines_are_stolen_by_other_ps(procs: int) -> None:
    """Goroutines queued on one P's local queue run on several: an idle P wakes and
    takes half of the queue (rounded up) while the first runs its share."""

    async def main() -> tuple[set[int], int, int]:
        n = 200  # fewer than a local queue holds: nothing spills to the global queue
        ran_on: list[int] = []
        done = Chan[None](n)

        async def worker() -> None:
            ran_on.append(current_runtime().curp.id)
            await done.send(None)

        for _ in range(n):
            go(worker)  # onto this P's runnext, the one before to its local queue
        for _ in range(n):
            await done.recv()
        stats = gosim.statistics()
        return set(ran_on), stats.steals, stats.goroutines_stolen

    ps, steals, stolen = gosim.run(main, procs=procs)
    assert len(ps) > 1, ps
    assert steals > 0 and stolen >= steals


@pytest.mark.parametrize("procs", [1, *PROCS])
def test_global_queue_is_served_every_61_ticks_under_local_load(procs: int) -> None:
    """A P whose local queue never runs dry still takes the global queue's head within
    61 of its switches: a chain of goroutines, each starting the next in ``runnext``,
    keeps the P busy, and main, sent to the global queue by ``gosched``, comes back."""

    async def main() -> list[int]:
        waits: list[int] = []
        stop = False

        async def link(left: int) -> None:
            if left and not stop:
                go(link, left - 1)  # into runnext: this P's queue is never empty

        go(link, 1_000_000)
        for _ in range(50):
            before = _switches()
            await gosim.gosched()
            waits.append(_switches() - before)
        stop = True
        return waits

    waits = gosim.run(main, procs=procs)
    # The switch that resumes main counts too; the chain is running throughout (every
    # wait is more than main's own switch back).
    assert max(waits) <= FAIRNESS_TICKS + 1, waits
    assert min(waits) >= 1


@pytest.mark.parametrize("procs", [1, *PROCS])
def test_gosched_round_robin_starves_nobody(procs: int) -> None:
    """Goroutines that yield in a loop all make progress together: no goroutine finishes
    its 200 turns before every other one had at least 100."""

    async def main() -> list[list[int]]:
        k = 16
        counts = [0] * k
        seen_at_finish: list[list[int]] = []
        done = Chan[None](k)

        async def spinner(i: int) -> None:
            for _ in range(200):
                counts[i] += 1
                await gosim.gosched()
            seen_at_finish.append(list(counts))
            await done.send(None)

        for i in range(k):
            go(spinner, i)
        for _ in range(k):
            await done.recv()
        return seen_at_finish

    for snapshot in gosim.run(main, procs=procs):
        assert min(snapshot) >= 100, snapshot


@pytest.mark.parametrize("procs", PROCS)
def test_sleepers_on_idle_ps_wake_while_another_p_is_busy(procs: int) -> None:
    """Timers live on the heap of the P that armed them. A goroutine stolen from main's
    queue sleeps on another P, which then goes idle, and wakes (alone in its P's
    ``runnext``: nothing else wakes that P) while one goroutine keeps main's P busy
    without ever parking (fast channel operations only, preempted every 10 ms): an idle
    P's timers are watched by the driver, and a P whose timer readied a goroutine takes
    turns again. The other goroutines return at once (a due timer on main's P would have
    its P run every P's timers). Counted in the busy goroutine's time slices, each of
    which ends with a turn of the driver: the sleeper is due within the first; without
    the watch its timer would wait for the driver's periodic check, 256 switches (here
    slices) in, and without the wake it would never run."""

    async def main() -> tuple[int, int, int]:
        n = 200  # more than a burst: the rest of main's queue is stolen
        home = current_runtime().curp
        sleepers = 0
        woke = 0
        slices = 0
        finished = Chan[None](1)

        async def sleeper() -> None:
            nonlocal sleepers, woke
            if current_runtime().curp is home or sleepers == 1:
                return
            sleepers += 1
            await gosim.sleep(0.005)
            woke += 1

        async def busy() -> None:
            nonlocal slices
            rt = current_runtime()
            scratch = Chan[int](1)
            give_up = time.monotonic() + 5.0  # bounded: the test fails, not hangs
            while woke < sleepers and time.monotonic() < give_up:
                before = rt.nswitch
                await scratch.send(1)  # completes at once: no park, no switch...
                await scratch.recv()
                slices += rt.nswitch != before  # ...but a preemption when the slice ends
            await finished.send(None)

        for _ in range(n):
            go(sleeper)
        await gosim.sleep(0.001)  # every sleeper has armed its timer
        go(busy)
        await finished.recv()
        return sleepers, woke, slices

    sleepers, woke, slices = gosim.run(main, procs=procs)
    assert sleepers == 1  # its timer is on another P's heap
    assert woke == sleepers
    assert slices <= 25, slices


@pytest.mark.parametrize("procs", PROCS)
def test_idle_ps_stay_idle_while_one_p_has_all_the_work(procs: int) -> None:
    """Two goroutines handing a value back and forth never leave their P (the woken
    partner goes to runnext, which no thief takes), so the other Ps stay on ``pidle``
    and take no turns: what makes ``procs=N`` cost what ``procs=1`` costs."""

    async def main() -> tuple[int, int, int]:
        ping, pong = Chan[int](), Chan[int]()

        async def echo() -> None:
            async for v in ping:
                await pong.send(v)

        go(echo)
        rt = current_runtime()
        idle_seen = procs
        for i in range(2_000):
            await ping.send(i)
            assert await pong.recv() == i
            idle_seen = min(idle_seen, len(rt.pidle))
        ping.close()
        return idle_seen, gosim.statistics().idle_procs, gosim.statistics().steals

    idle_seen, idle_procs, steals = gosim.run(main, procs=procs)
    assert idle_seen == procs - 1
    assert idle_procs == procs - 1
    assert steals == 0


@pytest.mark.parametrize("procs", [2, 8])
def test_an_idle_p_wakes_for_work_it_can_steal_and_goes_idle_again(procs: int) -> None:
    """``wakep``: a goroutine pushed to the tail of a P's local queue wakes one idle P
    to spin (one at a time: a second such goroutine wakes nobody while it spins); a G
    put in ``runnext`` alone wakes nobody; once the work is done every P but the one
    that idles in the driver is back on ``pidle``."""

    async def main() -> tuple[int, int, int, int, int]:
        rt = current_runtime()

        async def noop() -> None:
            pass

        go(noop)  # into runnext: nothing another P could steal
        after_first = rt.nmspinning
        go(noop)  # the first is kicked to the local queue: one P wakes to spin
        after_second = rt.nmspinning
        idle_after_second = len(rt.pidle)
        go(noop)  # another kicked, but a P spins already
        after_third = rt.nmspinning
        await gosim.sleep(0.001)
        return after_first, after_second, idle_after_second, after_third, len(rt.pidle)

    first, second, idle_second, third, idle_end = gosim.run(
        main, procs=procs, seed=3, virtual_time=True
    )
    assert (first, second, third) == (0, 1, 1)
    assert idle_second == procs - 2
    assert idle_end == procs - 1
