"""Deterministic mode: the same seed gives the same schedule, results and trace bytes;
without a seed, runs differ (the runtime randomizes where Go does)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

import gosim
from gosim import Chan, go, recv, select, send


async def busy_program(n_workers: int) -> list[tuple[int, int]]:
    """Many goroutines racing through selects, sleeps, gosched and buffered channels."""
    a: Chan[int] = Chan(2)
    b: Chan[int] = Chan()
    out: Chan[tuple[int, int]] = Chan(10_000)
    done: Chan[None] = Chan(n_workers)

    async def worker(k: int) -> None:
        for i in range(30):
            idx, v, _ = await select(recv(a), recv(b), send(a, k * 1000 + i), default=(i % 3 == 0))
            await out.send((k, idx if v is None else v))
            if i % 7 == 0:
                await gosim.sleep(0.001 * (k % 4))
            if i % 5 == 0:
                await gosim.gosched()
        await done.send(None)

    async def feeder() -> None:
        for i in range(200):
            await select(send(b, -i), recv(gosim.after(0.002)))

    go(feeder)
    for k in range(n_workers):
        go(worker, k)
    for _ in range(n_workers):
        await done.recv()
    result = []
    while out.len():
        v = await out.recv()
        assert v is not None
        result.append(v)
    return result


def traced_run(seed: int | None, procs: int = 4) -> tuple[list[tuple[int, int]], bytes]:
    trace = gosim.Trace()
    result = gosim.run(busy_program, 12, procs=procs, seed=seed, virtual_time=True, trace=trace)
    return result, trace.to_bytes()


def test_same_seed_same_results_and_identical_trace_bytes_over_many_runs() -> None:
    first_result, first_trace = traced_run(seed=1234)
    assert len(first_trace) > 10_000
    for _ in range(10):
        result, trace = traced_run(seed=1234)
        assert result == first_result
        assert trace == first_trace


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), procs=st.integers(1, 4))
def test_any_seed_replays_exactly(seed: int, procs: int) -> None:
    assert traced_run(seed, procs) == traced_run(seed, procs)


def test_different_seeds_give_different_schedules() -> None:
    traces = {traced_run(seed)[1] for seed in range(5)}
    assert len(traces) == 5


def test_unseeded_runs_differ() -> None:
    # Select choices, steal victims and P order come from an unseeded generator.
    results = {tuple(traced_run(None)[0]) for _ in range(5)}
    assert len(results) > 1
