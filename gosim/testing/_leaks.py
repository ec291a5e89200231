"""Goroutine leak checks: goroutines that outlive the code that started them.

When ``gosim.run``'s main returns, the program ends and every other goroutine is closed
silently, as in Go: a goroutine parked forever on a channel nobody sends on is then
invisible, though in a server it would pile up with every request. Go's ``goleak``
compares the goroutines alive at the end of a test with those at its start;
:func:`check_no_leaks` does the same around a block of a goroutine::

    async def main():
        async with gosim.testing.check_no_leaks():
            await serve_one_request()

The goroutines started while the block ran (their goid is higher than any at its
start, whoever started them) must all have ended by the time it ends. Some may be on
their way out (a worker that signalled its ``WaitGroup`` has not returned yet), so the
check gives them ``grace`` seconds on the runtime's clock (virtual under
``virtual_time=True``, so the wait then costs nothing), yielding and then sleeping with
a growing delay, as goleak retries. Those still alive then fail the check with
:class:`GoroutineLeak`, whose message lists each with its wait reason, its Python stack
(innermost call first, with file and line) and the function that started it, in the
words of Go's crash dumps. A block left by an exception is not checked: its exception
goes on unchanged.

The check raises in main, so ``gosim.run`` raises the :class:`GoroutineLeak` itself
(an exception that escapes a goroutine leaves ``run`` as itself, with Go's crash report
as a note).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gosim import lowlevel
from gosim._internals import G, goroutines
from gosim.lowlevel import current_g, current_runtime, goroutine_dump
from gosim.time import now, sleep

__all__ = ["GoroutineLeak", "check_no_leaks"]

_FIRST_SLEEP = 0.001
_MAX_SLEEP = 0.1
_YIELDS = 10  # rounds of gosched before the first sleep: most exits need no clock


class GoroutineLeak(AssertionError):
    """Goroutines started in a :func:`check_no_leaks` block were still alive ``grace``
    seconds after it ended. ``goids``: their ids; ``dump``: their stanzas (state,
    stack, creator), which the message ends with."""

    def __init__(self, goids: list[int], dump: str, grace: float) -> None:
        n = len(goids)
        super().__init__(
            f"found {n} leaked goroutine{'s' if n != 1 else ''}, still alive {grace:g} s "
            f"after the check_no_leaks block ended:\n\n{dump}"
        )
        self.goids = goids
        self.dump = dump


def _started_since(first: int, me: G) -> list[G]:
    return [g for g in goroutines() if g.goid >= first and g is not me]


@asynccontextmanager
async def check_no_leaks(grace: float = 1.0) -> AsyncIterator[None]:
    """Fail with :class:`GoroutineLeak` if goroutines started during the block are
    still alive ``grace`` seconds (runtime clock) after it ends. In a goroutine; the
    goroutines alive at its start are not checked (goleak's ``IgnoreCurrent``)."""
    if grace < 0:
        raise ValueError(f"check_no_leaks: grace must not be negative, got {grace}")
    me = current_g()
    first = current_runtime().goidgen + 1
    yield
    leaked = _started_since(first, me)
    for _ in range(_YIELDS):
        if not leaked:
            return
        await lowlevel.gosched()
        leaked = _started_since(first, me)
    deadline = now() + grace
    delay = _FIRST_SLEEP
    while leaked:
        left = deadline - now()
        if left <= 0:
            raise GoroutineLeak(
                [g.goid for g in leaked], goroutine_dump(leaked, stacks=True), grace
            )
        await sleep(min(delay, left))
        delay = min(delay * 2, _MAX_SLEEP)
        leaked = _started_since(first, me)
