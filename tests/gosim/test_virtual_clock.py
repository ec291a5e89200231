"""Virtual time under ``gosim.run``: an idle driver advances the clock itself.

With nothing runnable and no other trio task able to act (no syscall, no trio call, no
I/O), waiting in trio until its MockClock autojumps to the next timer costs a round of
trio's scheduler for every distinct timer deadline: in a simulation, every network
delivery. The driver jumps the clock to the deadline itself; the schedule it takes is
the same, and a syscall in flight still makes it wait in trio.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import gosim
from gosim import go
from gosim._core._runtime import Runtime


def _counting_sleep_forever(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    real = trio.sleep_forever

    async def counted() -> Any:
        count[0] += 1
        return await real()

    monkeypatch.setattr(trio, "sleep_forever", counted)
    return count


async def _sleepers(n: int) -> list[tuple[int, float]]:
    """Three goroutines sleeping at distinct times: 3n idle waits, in a known order."""
    out: list[tuple[int, float]] = []
    done: gosim.Chan[None] = gosim.Chan(3)

    async def sleeper(k: int) -> None:
        for _ in range(n):
            await gosim.sleep(0.001 * (k + 1) + 0.0001 * k)
            out.append((k, gosim.now()))
        await done.send(None)

    for k in range(3):
        go(sleeper, k)
    for _ in range(3):
        await done.recv()
    return out


def test_idle_virtual_driver_does_not_wait_in_trio(monkeypatch: pytest.MonkeyPatch) -> None:
    count = _counting_sleep_forever(monkeypatch)
    out = gosim.run(_sleepers, 300, procs=1, seed=3, virtual_time=True)
    assert len(out) == 900
    assert [t for _, t in out] == sorted(t for _, t in out)  # time only moves forward
    assert count[0] == 0  # not one idle wait went through trio's scheduler


def test_same_schedule_as_trio_autojump(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = gosim.run(_sleepers, 50, procs=2, seed=5, virtual_time=True)
    # The driver without a clock of its own to jump: every idle waits in trio, whose
    # MockClock autojumps to the same deadline.
    monkeypatch.setattr(
        Runtime, "virtual_jump", property(lambda s: None, lambda s, v: None), raising=False
    )
    count = _counting_sleep_forever(monkeypatch)
    slow = gosim.run(_sleepers, 50, procs=2, seed=5, virtual_time=True)
    assert count[0] > 100
    assert slow == fast


def test_a_trio_call_in_flight_holds_the_clock() -> None:
    async def main() -> float:
        async def later() -> None:
            await gosim.sleep(5.0)

        go(later)
        # Without a seed the trio call runs as a task of its own: a wake source the
        # driver cannot see coming, so it waits in trio and the clock stops at the
        # call's end (1 s), not at the goroutine's timer (5 s).
        await gosim.trio_call(trio.sleep, 1.0)
        return gosim.now()

    assert gosim.run(main, procs=1, virtual_time=True) == pytest.approx(1.0)
