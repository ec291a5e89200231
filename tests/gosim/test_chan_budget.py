"""The op budget: one rule for every channel operation and select, on each path.

An awaited channel operation or select that *returns* without parking spends one unit
of one countdown shared by channels and select, inside a runtime or not; at zero the
runtime's ``preempt_check`` is asked whether the running goroutine used up its slice.
An operation that raises, parks, or is a ``try_`` spends nothing. Each operation spends
on its own path (``send``, ``recv``, ``recv2``, ``__anext__`` in gosim/_chan.py,
``select`` in gosim/_select.py, and their twins in gosim/_speedups_chan.c.h and
gosim/_speedups_select.c.h), so each is driven here on its own: any window of exactly
``3 * OP_BUDGET`` operations that spend must ask ``preempt_check`` exactly three times,
whatever the countdown stood at when the window opened. Each runtime starts with a full
countdown. The suite runs this file on the C path and with ``GOSIM_PURE_PYTHON=1``, so
the two implementations are held to the same rule.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

import gosim
from gosim import Chan, _internals, go, lowlevel, recv, select, send

B = _internals.OP_BUDGET
WINDOW = 3 * B


def _counting_checks() -> list[int]:
    """Make the running runtime count its preempt checks (and never preempt, so no other
    goroutine runs inside a window). Returns the one-element counter."""
    rt: Any = lowlevel.current_runtime()
    calls = [0]

    def check() -> bool:
        calls[0] += 1
        return False

    rt.preempt_check = check
    return calls


async def _parked_senders(ch: Chan[int], n: int) -> None:
    for i in range(n):
        go(ch.send, i)
    while len(ch._sendq) < n:  # each parks on its first run
        await gosim.gosched()


async def _parked_receivers(ch: Chan[int], n: int) -> None:
    async def take() -> None:
        await ch.recv()

    for _ in range(n):
        go(take)
    while len(ch._recvq) < n:
        await gosim.gosched()


async def _parked_selects(ch: Chan[int], n: int) -> None:
    async def take() -> None:
        await select(recv(ch), recv(None))

    for _ in range(n):
        go(take)
    while len(ch._recvq) < n:
        await gosim.gosched()


# Each workload prepares its channel, then returns the window: WINDOW operations, each
# one that must spend exactly one unit.
Window = Callable[[], Awaitable[None]]


async def send_buffered() -> Window:
    ch: Chan[int] = Chan(WINDOW)

    async def run() -> None:
        for i in range(WINDOW):
            await ch.send(i)

    return run


async def send_to_waiting_receiver() -> Window:
    ch: Chan[int] = Chan()
    await _parked_receivers(ch, WINDOW)

    async def run() -> None:
        for i in range(WINDOW):
            await ch.send(i)

    return run


async def send_to_waiting_select() -> Window:
    ch: Chan[int] = Chan()
    await _parked_selects(ch, WINDOW)

    async def run() -> None:
        for i in range(WINDOW):
            await ch.send(i)

    return run


def _filled(n: int) -> Chan[int]:
    ch: Chan[int] = Chan(n)
    for i in range(n):
        assert ch.try_send(i)
    return ch


def _closed() -> Chan[int]:
    ch: Chan[int] = Chan()
    ch.close()
    return ch


def _receiving(op: str, ch: Chan[int]) -> Window:
    async def run() -> None:
        for _ in range(WINDOW):
            if op == "recv":
                await ch.recv()
            elif op == "recv2":
                await ch.recv2()
            elif op == "anext":
                await ch.__anext__()
            else:
                await select(recv(ch), recv(None))

    return run


def _receive_workload(op: str, source: str) -> Callable[[], Awaitable[Window]]:
    async def prepare() -> Window:
        if source == "buffer":
            return _receiving(op, _filled(WINDOW))
        if source == "closed":
            return _receiving(op, _closed())
        ch: Chan[int] = Chan()
        await _parked_senders(ch, WINDOW)
        return _receiving(op, ch)

    prepare.__name__ = f"{op}_from_{source}"
    return prepare


async def send_awaited_after_a_receiver_came() -> Window:
    # Each send is made when it cannot complete and awaited once it can: it completes
    # at the await, without parking, and spends like any other.
    ch: Chan[int] = Chan()
    sends = [ch.send(i) for i in range(WINDOW)]
    await _parked_receivers(ch, WINDOW)

    async def run() -> None:
        for s in sends:
            await s

    return run


async def select_send_buffered() -> Window:
    ch: Chan[int] = Chan(WINDOW)

    async def run() -> None:
        for i in range(WINDOW):
            await select(send(ch, i), recv(None))

    return run


async def select_default() -> Window:
    ch: Chan[int] = Chan()

    async def run() -> None:
        for _ in range(WINDOW):
            await select(recv(ch), default=True)

    return run


async def channels_and_select_share_one_countdown() -> Window:
    ch = _filled(WINDOW)

    async def run() -> None:
        for i in range(WINDOW):
            if i % 2:
                await ch.recv()
            else:
                await select(recv(ch), recv(None))

    return run


WORKLOADS: list[Callable[[], Awaitable[Window]]] = [
    send_buffered,
    send_to_waiting_receiver,
    send_to_waiting_select,
    send_awaited_after_a_receiver_came,
    *[
        _receive_workload(op, source)
        for op in ("recv", "recv2", "anext", "select")
        for source in ("buffer", "sender", "closed")
        if (op, source) != ("anext", "closed")  # the end of `async for` raises
    ],
    select_send_buffered,
    select_default,
    channels_and_select_share_one_countdown,
]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__)
def test_every_fast_path_spends_one_unit(workload: Callable[[], Awaitable[Window]]) -> None:
    async def main() -> int:
        window = await workload()
        calls = _counting_checks()
        await window()
        return calls[0]

    assert gosim.run(main, procs=1) == 3


def test_what_raises_or_tries_spends_nothing() -> None:
    async def main() -> int:
        closed = _closed()
        full: Chan[int] = _filled(1)
        calls = _counting_checks()
        for _ in range(WINDOW):
            async for _ in closed:  # ends at once: StopAsyncIteration
                pass
            with pytest.raises(gosim.SendOnClosedChannel):
                await closed.send(0)
            with pytest.raises(gosim.SendOnClosedChannel):
                await select(send(closed, 0))
            assert not full.try_send(1)
            assert full.try_recv()[2] and full.try_send(1)
        return calls[0]

    assert gosim.run(main, procs=1) == 0


def test_a_runtime_starts_with_a_full_budget_after_operations_outside_one() -> None:
    # The countdown is one process-wide counter, which a channel outside a runtime
    # spends too; the next runtime refills it as it starts, so its first check comes
    # after exactly OP_BUDGET operations whatever happened before.
    async def drain_to_a_check() -> None:
        calls = _counting_checks()
        ch = _filled(2 * B)
        while not calls[0]:
            await ch.recv()
        # The countdown is full now.

    async def ops_to_first_check() -> int:
        calls = _counting_checks()
        ch = _filled(2 * B)
        n = 0
        while not calls[0]:
            await ch.recv()
            n += 1
        return n

    async def outside(ch: Chan[int], rounds: int) -> None:
        for i in range(rounds):  # four operations a round, each spending one unit
            await ch.send(i)
            await ch.recv()
            await ch.send(i)
            await select(recv(ch), default=True)

    rounds = B // 8
    gosim.run(drain_to_a_check, procs=1)
    trio.run(outside, Chan(1), rounds)
    assert gosim.run(ops_to_first_check, procs=1) == B


def test_a_send_awaited_after_a_receiver_came_hands_it_the_value() -> None:
    # The pure-Python send used to park on its await even with a receiver waiting, and
    # both goroutines slept for ever (Deadlock); the C twin re-checked. Now both do.
    async def main() -> int | None:
        ch: Chan[int] = Chan()
        got: Chan[int | None] = Chan(1)
        late = ch.send(7)  # no receiver yet: the send cannot complete now

        async def receiver() -> None:
            await got.send(await ch.recv())

        go(receiver)
        while not ch._recvq:
            await gosim.gosched()
        await late
        return await got.recv()

    assert gosim.run(main, procs=1) == 7


def test_a_send_awaited_after_room_was_made_fills_the_buffer() -> None:
    async def main() -> list[int | None]:
        ch = _filled(1)
        late = ch.send(2)  # the buffer is full now
        first = await ch.recv()
        await late  # room now: into the buffer, no park
        return [first, await ch.recv()]

    assert gosim.run(main, procs=1) == [0, 2]


def _seeded_spinners(trace: gosim.Trace) -> list[tuple[str, int]]:
    """Two goroutines on one P that never park, each doing 12,000 buffered sends and
    receives: which one runs when is decided by deterministic preemption alone (a
    count of spent budget), so the order of their log entries shows where the op
    budget stood when the runtime started."""
    log: list[tuple[str, int]] = []

    async def spinner(name: str, done: Chan[None]) -> None:
        ch: Chan[int] = Chan(1)
        for i in range(12_000):
            await ch.send(i)
            await ch.recv()
            if not log or log[-1][0] != name:
                log.append((name, i))  # where the other one was preempted
        await done.send(None)

    async def main() -> None:
        done: Chan[None] = Chan()
        go(spinner, "a", done)
        go(spinner, "b", done)
        await done.recv()
        await done.recv()

    gosim.run(main, procs=1, seed=7, virtual_time=True, trace=trace)
    return log


def test_a_runtime_starts_with_a_full_budget() -> None:
    """Two seeded runs in one process take the same schedule, whatever an unrelated
    runtime before them left of the budget (it is refilled as each runtime starts)."""

    async def unrelated(n: int) -> None:
        ch: Chan[int] = Chan(1)
        for i in range(n):
            await ch.send(i)
            await ch.recv()

    gosim.run(unrelated, B // 3)
    first_trace, second_trace = gosim.Trace(), gosim.Trace()
    first = _seeded_spinners(first_trace)
    gosim.run(unrelated, B // 5)
    second = _seeded_spinners(second_trace)
    assert len(first) > 2  # preemption interleaved them
    assert first == second
    assert first_trace.to_bytes() == second_trace.to_bytes()
