"""gosim.testing.check_no_leaks: goroutines that outlive a block are reported (goleak)."""

from __future__ import annotations

import inspect
import re

import pytest

import gosim
from gosim import Chan, go, lowlevel, sync
from gosim.testing import GoroutineLeak, check_no_leaks


async def leaky(ch: Chan[int]) -> None:
    await ch.recv()  # nobody ever sends


LEAK_LINE = inspect.getsourcelines(leaky)[1] + 1


async def main_with_leak() -> None:
    async with check_no_leaks(grace=0.05):
        go(leaky, Chan[int]())


def test_a_goroutine_blocked_forever_is_reported() -> None:
    """Its id, wait reason, where it waits (function, file and line) and who started
    it; run() raises the GoroutineLeak itself, with the crash report as a note."""
    with pytest.raises(GoroutineLeak) as info:
        gosim.run(main_with_leak)
    leak = info.value
    assert leak.goids == [2]
    assert str(leak).startswith(
        "found 1 leaked goroutine, still alive 0.05 s after the check_no_leaks block ended:"
    )
    stanza = leak.dump
    assert stanza.startswith("goroutine 2 [chan receive]:\n")
    assert re.search(
        rf"^{re.escape(__name__)}\.leaky\(\.\.\.\)\n\t{re.escape(__file__)}:{LEAK_LINE}$",
        stanza,
        re.M,
    ), stanza
    assert stanza.rstrip().endswith(f"created by {__name__}.main_with_leak in goroutine 1")
    assert stanza in lowlevel.panic_report(leak)  # the crash report carries the list too


def test_virtual_time_gives_the_grace_without_waiting() -> None:
    with pytest.raises(GoroutineLeak):
        gosim.run(main_with_leak, virtual_time=True, seed=1)


def test_a_clean_program_passes_and_goroutines_on_their_way_out_are_waited_for() -> None:
    """Workers that have signalled the WaitGroup but not yet returned, one that ends
    after a sleep within the grace, and a goroutine from before the block (not
    checked) make no leak."""

    async def worker(wg: sync.WaitGroup, out: Chan[int], i: int) -> None:
        await out.send(i)
        wg.done()
        await gosim.gosched()  # still alive when main sees the WaitGroup finish

    async def late() -> None:
        await gosim.sleep(0.02)

    async def main() -> tuple[int, list[int]]:
        older: Chan[int] = Chan()
        go(leaky, older)  # started before the block
        async with check_no_leaks(grace=5.0):
            wg = sync.WaitGroup()
            out: Chan[int] = Chan(10)
            for i in range(10):
                wg.add(1)
                go(worker, wg, out, i)
            go(late)
            await wg.wait()
            alive_at_end = gosim.num_goroutine()
        return alive_at_end, sorted(out.try_recv()[0] or 0 for _ in range(10))

    alive_at_end, got = gosim.run(main)
    assert got == list(range(10))
    assert alive_at_end > 2  # besides main and the older goroutine: the check waited


def test_a_failing_block_keeps_its_own_exception() -> None:
    async def main() -> None:
        async with check_no_leaks(grace=0.05):
            go(leaky, Chan[int]())
            raise KeyError("the body's")

    with pytest.raises(KeyError, match="the body's"):
        gosim.run(main)


def test_negative_grace_is_refused() -> None:
    async def main() -> None:
        async with check_no_leaks(grace=-1):
            pass

    with pytest.raises(ValueError, match="grace must not be negative, got -1"):
        gosim.run(main)
