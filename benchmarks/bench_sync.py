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


@pytest.mark.parametrize("peer", ["gosim", "trio"])
@pytest.mark.parametrize("workload", ["uncontended", "contended"])
def bench_mutex(benchmark: Any, workload: str, peer: str) -> None:
    n = _n(benchmark)
    if workload == "contended" and peer == "trio":
        n //= 10  # trio's checkpoint is a full scheduler pass: keep the round short
    benchmark.group = f"mutex-{workload}"
    elapsed: list[float] = []

    def once() -> None:
        fn = {
            ("uncontended", "gosim"): lambda: gosim.run(_gosim_uncontended, n, procs=1),
            ("uncontended", "trio"): lambda: trio.run(_trio_uncontended, n),
            ("contended", "gosim"): lambda: gosim.run(_gosim_contended, n, procs=1),
            ("contended", "trio"): lambda: trio.run(_trio_contended, n),
        }[(workload, peer)]
        elapsed.append(fn())

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 5, iterations=1)
    benchmark.extra_info["ns_per_op"] = sorted(elapsed)[len(elapsed) // 2] / n * 1e9
