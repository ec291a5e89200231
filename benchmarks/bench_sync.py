"""gosim.sync.Mutex against trio.Lock, each in its own runtime, side by side (issue 3).

* ``uncontended``: one goroutine/task locks and unlocks N times (op = lock+unlock);
* ``contended``: 4 goroutines/tasks each lock, yield inside the critical section,
  unlock, N times in all (op = one critical section, yields included).

``extra_info['ns_per_op']`` is the figure; the target is uncontended gosim.Mutex at least
5x faster than trio.Lock. Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_sync.py --benchmark-json=sync.json
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import trio

import gosim
from gosim.sync import Mutex, WaitGroup


def _n(benchmark: Any) -> int:
    return 2_000 if benchmark.disabled else 200_000


async def _gosim_uncontended(n: int) -> float:
    mu = Mutex()
    t0 = time.perf_counter()
    for _ in range(n):
        await mu.lock()
        mu.unlock()
    return time.perf_counter() - t0


async def _trio_uncontended(n: int) -> float:
    lock = trio.Lock()
    t0 = time.perf_counter()
    for _ in range(n):
        await lock.acquire()
        lock.release()
    return time.perf_counter() - t0


async def _gosim_contended(n: int) -> float:
    mu = Mutex()
    wg = WaitGroup()

    async def worker(k: int) -> None:
        for _ in range(k):
            await mu.lock()
            await gosim.gosched()
            mu.unlock()

    t0 = time.perf_counter()
    for _ in range(4):
        wg.go(worker, n // 4)
    await wg.wait()
    return time.perf_counter() - t0


async def _trio_contended(n: int) -> float:
    lock = trio.Lock()

    async def worker(k: int) -> None:
        for _ in range(k):
            async with lock:
                await trio.lowlevel.checkpoint()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(worker, n // 4)
    return time.perf_counter() - t0


# One round of each (workload, peer): n operations in a fresh runtime; the seconds of
# the measured loop.
ROUNDS: dict[tuple[str, str], Callable[[int], float]] = {
    ("uncontended", "gosim"): lambda n: gosim.run(_gosim_uncontended, n),
    ("uncontended", "trio"): lambda n: trio.run(_trio_uncontended, n),
    ("contended", "gosim"): lambda n: gosim.run(_gosim_contended, n),
    ("contended", "trio"): lambda n: trio.run(_trio_contended, n),
}


def ops(workload: str, peer: str, n: int) -> int:
    """Operations in a round of ``n``: trio's contended rounds are a tenth (a checkpoint
    is a full scheduler pass), so the round stays short."""
    return n // 10 if (workload, peer) == ("contended", "trio") else n


@pytest.mark.parametrize("peer", ["gosim", "trio"])
@pytest.mark.parametrize("workload", ["uncontended", "contended"])
def bench_mutex(benchmark: Any, workload: str, peer: str) -> None:
    n = ops(workload, peer, _n(benchmark))
    benchmark.group = f"mutex-{workload}"
    elapsed: list[float] = []
    one = ROUNDS[(workload, peer)]
    benchmark.pedantic(
        lambda: elapsed.append(one(n)), rounds=1 if benchmark.disabled else 5, iterations=1
    )
    benchmark.extra_info["ns_per_op"] = sorted(elapsed)[len(elapsed) // 2] / n * 1e9
