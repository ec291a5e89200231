"""Spinlocks and atomics under contention, side by side with ``threading.Lock``.

Run: ``pytest benchmarks/bench_spin.py --benchmark-json=spin.json`` (real timings), then
``python benchmarks/plot_spin.py spin.json`` draws docs/img/spin_throughput.png.
``--benchmark-disable`` runs each once as a smoke test.

Groups (peers compared within a group):

* ``contended-counter``: 2 OS threads share a budget of counter increments, each
  increment taken under the lock. Spinlocks run inside ``nogil`` numba kernels
  (``gosim.spin.measure_contention``); the peer is two Python threads doing the same
  under ``threading.Lock``. ``extra_info``: acquisitions per second (``throughput``,
  the median round), Jain's fairness index over the two threads' acquisition counts
  (``fairness``, the median round, and ``fairness_min``), and ``ratio_to_threading``.
* ``python-threads``: the same workload from Python threads through the lock objects'
  Python methods, to show what a spinlock costs where the GIL must move at each
  hand-over.
* ``atomic-add``: 2 threads adding 1 to one cell: ``atomic_add`` in ``nogil`` kernels,
  ``Int64.add`` from Python threads, and a Python int under ``threading.Lock``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numba import njit

from gosim import spin
from gosim.atomic import Int64, atomic_add

THREADS = 2
KERNEL_BUDGET = 2_000_000
PYTHON_BUDGET = 1_000_000
PYTHON_SPIN_BUDGET = 20_000  # FIFO spinlocks from Python threads hand the GIL over each time
ATOMIC_ADDS = 2_000_000  # per thread in kernels
PYTHON_ADDS = 200_000  # per thread from Python
ROUNDS = 5

LOCK_CLASSES = [
    spin.TASLock,
    spin.TTASLock,
    spin.TicketLock,
    spin.MCSLock,
    spin.CLHLock,
    spin.RuntimeLock,
]

# Throughput of the threading.Lock peer, filled in by its benchmark, for the ratios.
_baseline: dict[str, float] = {}


def python_threads_contend(lock: Any, threads: int, budget: int) -> spin.ContentionResult:
    """The spend-a-budget workload of ``spin.measure_contention``, from Python threads,
    under any lock with the context-manager protocol."""
    shared = [0]
    counts = [0] * threads
    barrier = threading.Barrier(threads)

    def body(i: int) -> None:
        barrier.wait()
        mine = 0
        while True:
            with lock:
                if shared[0] >= budget:
                    break
                shared[0] += 1
            mine += 1
        counts[i] = mine

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    return spin.ContentionResult(type(lock).__name__, tuple(counts), shared[0], seconds)


def run_rounds(
    benchmark: Any,
    make_round: Callable[[], spin.ContentionResult],
    group: str,
    *,
    baseline: bool = False,
) -> None:
    """Time ROUNDS rounds; record the median round's throughput and the fairness, and
    the ratio to the group's threading.Lock peer (which runs first in each group)."""
    results: list[spin.ContentionResult] = []

    def one_round() -> None:
        r = make_round()
        assert r.total == r.counter, "lost an update: the lock did not exclude"
        results.append(r)

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    by_speed = sorted(results, key=lambda r: r.throughput)
    median = by_speed[len(by_speed) // 2]
    info = benchmark.extra_info
    info["threads"] = THREADS
    info["throughput"] = median.throughput
    info["fairness"] = statistics.median(r.fairness for r in results)
    info["fairness_min"] = min(r.fairness for r in results)
    info["acquisitions"] = list(median.acquisitions)
    if baseline:
        _baseline[group] = median.throughput
    elif group in _baseline:
        info["ratio_to_threading"] = median.throughput / _baseline[group]


@pytest.mark.benchmark(group="contended-counter")
def bench_threading_lock_python_threads(benchmark: Any) -> None:
    lock = threading.Lock()
    run_rounds(
        benchmark,
        lambda: python_threads_contend(lock, THREADS, PYTHON_BUDGET),
        "contended-counter",
        baseline=True,
    )
    benchmark.extra_info["lock"] = "threading.Lock (Python threads)"


@pytest.mark.benchmark(group="contended-counter")
@pytest.mark.parametrize("cls", LOCK_CLASSES, ids=lambda c: c.__name__)
def bench_spinlock_nogil_kernels(benchmark: Any, cls: Any) -> None:
    lock = cls()
    run_rounds(
        benchmark,
        lambda: spin.measure_contention(lock, THREADS, KERNEL_BUDGET),
        "contended-counter",
    )
    benchmark.extra_info["lock"] = f"{cls.__name__} (nogil kernels)"


@pytest.mark.benchmark(group="python-threads")
def bench_python_threads_threading_lock(benchmark: Any) -> None:
    lock = threading.Lock()
    run_rounds(
        benchmark,
        lambda: python_threads_contend(lock, THREADS, PYTHON_SPIN_BUDGET),
        "python-threads",
        baseline=True,
    )
    benchmark.extra_info["lock"] = "threading.Lock (Python threads)"


@pytest.mark.benchmark(group="python-threads")
@pytest.mark.parametrize("cls", LOCK_CLASSES, ids=lambda c: c.__name__)
def bench_python_threads_spinlock(benchmark: Any, cls: Any) -> None:
    lock = cls()
    run_rounds(
        benchmark,
        lambda: python_threads_contend(lock, THREADS, PYTHON_SPIN_BUDGET),
        "python-threads",
    )
    benchmark.extra_info["lock"] = f"{cls.__name__} (Python threads)"


# ------------------------------------------------------------------------ atomic add


@njit(nogil=True)
def _add_kernel(cells: Any, n: int) -> None:
    for _ in range(n):
        atomic_add(cells, 0, 1)


def _threads(target: Callable[..., None], args: tuple[Any, ...]) -> float:
    workers = [threading.Thread(target=target, args=args) for _ in range(THREADS)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def run_adds(benchmark: Any, one_round: Callable[[], tuple[int, float]], what: str) -> None:
    rates: list[float] = []

    def timed() -> None:
        total, seconds = one_round()
        rates.append(total / seconds)

    benchmark.pedantic(timed, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    benchmark.extra_info["throughput"] = statistics.median(rates)
    benchmark.extra_info["what"] = what
    if what == "threading.Lock":
        _baseline["adds"] = statistics.median(rates)
    elif "adds" in _baseline:
        benchmark.extra_info["ratio_to_threading"] = statistics.median(rates) / _baseline["adds"]


def add_threading_lock(adds: int = PYTHON_ADDS) -> tuple[int, float]:
    """THREADS Python threads add 1 ``adds`` times each under one threading.Lock."""
    lock = threading.Lock()
    box = [0]

    def work() -> None:
        for _ in range(adds):
            with lock:
                box[0] += 1

    seconds = _threads(work, ())
    assert box[0] == THREADS * adds
    return box[0], seconds


def add_atomic_kernels(adds: int = ATOMIC_ADDS) -> tuple[int, float]:
    """THREADS threads each run a nogil kernel of ``adds`` atomic adds to one cell."""
    _add_kernel(np.zeros(1, dtype=np.int64), 1)  # compiled (once) outside the timing
    cells = np.zeros(1, dtype=np.int64)
    seconds = _threads(_add_kernel, (cells, adds))
    assert cells[0] == THREADS * adds
    return int(cells[0]), seconds


def add_int64_python(adds: int = PYTHON_ADDS) -> tuple[int, float]:
    """THREADS Python threads call ``Int64.add(1)`` ``adds`` times each."""
    counter = Int64()

    def work() -> None:
        add = counter.add
        for _ in range(adds):
            add(1)

    seconds = _threads(work, ())
    assert counter.load() == THREADS * adds
    return counter.load(), seconds


@pytest.mark.benchmark(group="atomic-add")
def bench_add_threading_lock_python(benchmark: Any) -> None:
    run_adds(benchmark, add_threading_lock, "threading.Lock")


@pytest.mark.benchmark(group="atomic-add")
def bench_add_atomic_nogil_kernels(benchmark: Any) -> None:
    run_adds(benchmark, add_atomic_kernels, "atomic_add in nogil kernels")


@pytest.mark.benchmark(group="atomic-add")
def bench_add_int64_python_threads(benchmark: Any) -> None:
    run_adds(benchmark, add_int64_python, "Int64.add from Python threads")
