"""Running several store calls at once in goroutines, for tests that need them in one batch."""

from __future__ import annotations

from typing import Any

import gosim


async def gather(calls: list[Any]) -> list[Any]:
    """Start every call (an awaitable factory) as its own goroutine at once; return
    what each returned or raised, in order."""
    results: list[Any] = [None] * len(calls)
    done: gosim.Chan[None] = gosim.Chan(len(calls))

    async def one(i: int) -> None:
        try:
            results[i] = await calls[i]()
        except Exception as exc:
            results[i] = exc
        await done.send(None)

    for i in range(len(calls)):
        gosim.go(one, i)
    for _ in calls:
        await done.recv()
    return results
