"""Timers, tickers and sleeps on virtual time (Go 1.23 timer-channel semantics)."""

from __future__ import annotations

import pytest
import trio

import gosim
from gosim import Chan, go, recv, select


def vrun(main, *args):  # type: ignore[no-untyped-def]
    return gosim.run(main, *args, procs=2, seed=5, virtual_time=True)


def test_sleep_orders_wakeups_by_deadline() -> None:
    async def main() -> list[int]:
        out: Chan[int] = Chan(10)

        async def sleeper(d: int) -> None:
            await gosim.sleep(d)
            await out.send(d)

        for d in (5, 1, 4, 2, 3):
            go(sleeper, d)
        return [await out.recv() or 0 for _ in range(5)]

    assert vrun(main) == [1, 2, 3, 4, 5]


def test_timer_fires_once_with_the_time() -> None:
    async def main() -> tuple[float, int, int]:
        start = gosim.now()
        t = gosim.Timer(2.0)
        fired_at = await t.c.recv()
        assert fired_at is not None
        return fired_at - start, t.c.len(), t.c.cap()

    elapsed, length, cap = vrun(main)
    assert elapsed == pytest.approx(2.0)
    assert (length, cap) == (0, 0)  # Go 1.23: timer channels report len and cap 0


def test_stop_before_firing_returns_true_and_nothing_arrives() -> None:
    async def main() -> tuple[bool, bool, int]:
        t = gosim.Timer(1.0)
        stopped = t.stop()
        again = t.stop()
        await gosim.sleep(5)
        i, _, _ = await select(recv(t.c), default=True)
        return stopped, again, i

    assert vrun(main) == (True, False, -1)


def test_stop_after_fire_but_before_receive_discards_the_stale_value() -> None:
    async def main() -> tuple[bool, int]:
        t = gosim.Timer(1.0)
        await gosim.sleep(2)  # fired, value not received
        pending = t.stop()
        i, _, _ = await select(recv(t.c), default=True)
        return pending, i

    assert vrun(main) == (True, -1)


def test_reset_rearms_without_delivering_the_old_value() -> None:
    async def main() -> tuple[bool, float]:
        start = gosim.now()
        t = gosim.Timer(1.0)
        await gosim.sleep(2)
        pending = t.reset(3.0)
        v = await t.c.recv()
        assert v is not None
        return pending, v - start

    pending, at = vrun(main)
    assert pending is True
    assert at == pytest.approx(5.0)


def test_ticker_ticks_every_period_and_stop_ends_it() -> None:
    async def main() -> tuple[list[float], int]:
        start = gosim.now()
        tk = gosim.Ticker(0.25)
        ticks = []
        for _ in range(4):
            v = await tk.c.recv()
            assert v is not None
            ticks.append(round(v - start, 6))
        tk.stop()
        await gosim.sleep(1)
        i, _, _ = await select(recv(tk.c), default=True)
        return ticks, i

    assert vrun(main) == ([0.25, 0.5, 0.75, 1.0], -1)


def test_slow_ticker_receiver_drops_ticks() -> None:
    async def main() -> float:
        start = gosim.now()
        tk = gosim.Ticker(1.0)
        await gosim.sleep(3.5)  # ticks at 1, 2, 3: one slot, so one is kept
        first = await tk.c.recv()
        second = await tk.c.recv()
        assert first is not None and second is not None
        tk.stop()
        return second - start

    assert vrun(main) == pytest.approx(4.0)


def test_ticker_rejects_non_positive_periods() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="non-positive interval for NewTicker"):
            gosim.Ticker(0)
        assert gosim.time.tick(-1) is None

    vrun(main)


def test_after_func_runs_in_its_own_goroutine_and_stop_prevents_it() -> None:
    async def main() -> tuple[list[str], bool, bool]:
        log: list[str] = []

        async def hello(who: str) -> None:
            log.append(f"{who} in goroutine {gosim.goid()}")

        gosim.after_func(1.0, hello, "a")
        cancelled = gosim.after_func(1.0, hello, "b")
        prevented = cancelled.stop()
        await gosim.sleep(2)
        return log, prevented, cancelled.stop()

    log, prevented, again = vrun(main)
    assert log == ["a in goroutine 2"]
    assert (prevented, again) == (True, False)


def test_ticker_reset_changes_the_period_and_drops_a_pending_tick() -> None:
    async def main() -> list[float]:
        start = gosim.now()
        tk = gosim.Ticker(1.0)
        await gosim.sleep(1.5)  # the tick at 1.0 waits, unreceived
        tk.reset(0.25)  # Go 1.23: no tick from before reset is received after it
        ticks = []
        for _ in range(3):
            v = await tk.c.recv()
            assert v is not None
            ticks.append(round(v - start, 6))
        with pytest.raises(ValueError, match=r"non-positive interval for Ticker\.Reset"):
            tk.reset(0)
        tk.stop()
        return ticks

    assert vrun(main) == [1.75, 2.0, 2.25]


def test_after_func_reset_moves_the_call_and_reports_whether_it_was_pending() -> None:
    async def main() -> tuple[list[float], bool, bool]:
        start = gosim.now()
        when: list[float] = []

        async def record() -> None:
            when.append(round(gosim.now() - start, 6))

        t = gosim.after_func(1.0, record)
        await gosim.sleep(0.5)
        was_pending = t.reset(2.0)  # from now: the call moves to 2.5
        await gosim.sleep(3.0)
        again = t.reset(1.0)  # it already ran: not pending, but it is armed again
        await gosim.sleep(2.0)
        return when, was_pending, again

    when, was_pending, again = vrun(main)
    assert when == [2.5, 4.5]
    assert (was_pending, again) == (True, False)


def test_select_timeout_with_after() -> None:
    async def main() -> int:
        never: Chan[int] = Chan()
        i, _, _ = await select(recv(never), recv(gosim.after(0.5)))
        return i

    assert vrun(main) == 1


def test_many_resets_do_not_grow_the_timer_heap_without_bound() -> None:
    async def main() -> int:
        t = gosim.Timer(10.0)
        for _ in range(10_000):
            t.reset(10.0)
        rt = gosim.lowlevel.current_runtime()
        return sum(len(p.timers.heap) for p in rt.allp)

    assert vrun(main) < 1_000


def test_the_runtime_reads_trios_clock_in_c_on_its_timebase() -> None:
    """On trio's own clock the runtime reads the time through the C twin of
    SystemClock.current_time (where the accelerator is built): every read falls
    between trio's reads around it, and sleeps measured either way agree."""
    from gosim._core._accel import speedups  # noqa: PLC0415
    from gosim.lowlevel import current_runtime  # noqa: PLC0415

    def bracketed() -> tuple[float, float, float]:
        """trio's time, the runtime's, trio's again: the runtime's read between."""
        return trio.current_time(), gosim.now(), trio.current_time()

    async def main() -> tuple[str, int, tuple[float, float, float], tuple[float, float, float]]:
        reader = type(current_runtime().now).__name__
        inside = 0
        for _ in range(1000):
            before, now, after = bracketed()
            inside += before <= now <= after
        start = bracketed()
        await gosim.sleep(0.05)
        return reader, inside, start, bracketed()

    reader, inside, start, end = gosim.run(main)
    assert reader == ("MonotonicClock" if speedups is not None else "method")
    assert inside == 1000
    # The sleep as the runtime measured it lies within what trio's reads around its two
    # reads allow (a preemption between two reads widens the bounds, never breaks them).
    slept = end[1] - start[1]
    assert slept >= 0.05
    assert end[0] - start[2] <= slept <= end[2] - start[0]


def test_the_runtimes_own_virtual_clock_reads_as_trio_does() -> None:
    """gosim.run(virtual_time=True)'s MockClock (rate 0, no one else's) is read
    through its virtual base, without a Python frame: every read equals trio's
    current_time, before and after the clock's jumps."""
    from gosim.lowlevel import current_runtime  # noqa: PLC0415

    async def main() -> tuple[str, list[bool]]:
        same = []
        for k in range(5):
            same.append(gosim.now() == trio.current_time())
            await gosim.sleep(0.25 * k + 0.001)
            same.append(gosim.now() == trio.current_time())
        return type(current_runtime().now).__name__, same

    reader, same = vrun(main)
    assert reader == "partial" and all(same), same
