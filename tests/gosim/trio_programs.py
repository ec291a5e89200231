"""Two bugs of ``explore_programs.py`` written with trio's primitives instead of
gosim's, the same logic line for line: what plain trio's own scheduling makes of them
(``test_explore.py`` counts how often it hits each bug)."""

from __future__ import annotations

from typing import Any

import trio

from .explore_programs import LEASE


async def _bystander(steps: int = 4) -> None:
    for _ in range(steps):
        await trio.sleep(0)


async def lost_update() -> int:
    """``explore_programs.lost_update`` on trio: its invariant wants 2."""
    state = {"n": 0}

    async def slow_increment() -> None:
        v = state["n"]
        await trio.sleep(0)  # any wait between the read and the write
        state["n"] = v + 1

    async def increment() -> None:
        state["n"] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_bystander)
        nursery.start_soon(slow_increment)
        nursery.start_soon(increment)
    return state["n"]


async def lease_takeover() -> list[tuple[str, str]]:
    """``explore_programs.lease_takeover`` on trio (run it on a ``MockClock``): its
    invariant, ``one_writer``, wants every write by the lease's holder then."""
    lease: dict[str, Any] = {"holder": "a", "until": trio.current_time() + LEASE}
    disk = trio.Lock()
    log: list[tuple[str, str]] = []

    async def write(who: str) -> None:
        async with disk:
            log.append((who, lease["holder"]))

    async def holder() -> None:
        if trio.current_time() < lease["until"]:
            await write("a")  # the bug: the check above is stale once the disk waits

    async def compactor() -> None:
        async with disk:
            await trio.sleep(1.5 * LEASE)

    async def contender() -> None:
        await trio.sleep(LEASE)  # the lease has run out: take it over
        lease.update(holder="b", until=trio.current_time() + LEASE)
        await write("b")

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_bystander)
        nursery.start_soon(holder)
        nursery.start_soon(compactor)
        nursery.start_soon(contender)
    return log
