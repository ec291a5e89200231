"""Measure a lock under contention: threads running ``nogil`` kernels that count under it.

Two workloads, both a shared counter incremented with a plain (non-atomic) load and store
inside the critical section, so that any failure of mutual exclusion loses increments:

* :func:`count_under_lock`: each of ``threads`` kernels increments ``increments`` times,
  pausing between the read and the write; the result must be exactly
  ``threads * increments``.
* :func:`measure_contention`: the kernels race to spend a shared budget of increments,
  each counting its own acquisitions; throughput is the budget over the wall time and
  fairness is Jain's index over the per-thread counts (1 = equal shares, 1/n = one
  thread took everything). ``sum(acquisitions) == budget`` is the mutual-exclusion check.

Both kernels meet at a spinning barrier first, so thread start-up skew does not count as
unfairness.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from gosim.atomic import atomic_add, atomic_load_acquire
from gosim.jit import kernel

from . import _kernels as k
from ._cpu import cpu_relax
from ._locks import QueueSpinLock, SpinLock, new_words

__all__ = ["ContentionResult", "count_under_lock", "jain_index", "measure_contention"]

_kernel = kernel(refcounts=False)  # no allocation: see gosim.jit.kernel


_COUNTER = 0
_BARRIER = k.LINE_WORDS


@_kernel
def _barrier(shared: Any, n_threads: int) -> None:
    atomic_add(shared, _BARRIER, 1)
    while atomic_load_acquire(shared, _BARRIER) < n_threads:
        cpu_relax()


@_kernel
def _hammer(kind: int, words: Any, me: int, shared: Any, n_threads: int, increments: int) -> int:
    _barrier(shared, n_threads)
    for _ in range(increments):
        k.spin_acquire(kind, words, me)
        # Deliberately not atomic, and with a pause between the read and the write, so
        # that two threads inside the critical section at once lose an increment.
        seen = shared[_COUNTER]
        cpu_relax()
        shared[_COUNTER] = seen + 1
        k.spin_release(kind, words, me)
    return increments


@_kernel
def _spend(kind: int, words: Any, me: int, shared: Any, n_threads: int, budget: int) -> int:
    _barrier(shared, n_threads)
    mine = 0
    while True:
        k.spin_acquire(kind, words, me)
        taken = shared[_COUNTER]
        if taken >= budget:
            k.spin_release(kind, words, me)
            return mine
        shared[_COUNTER] = taken + 1
        k.spin_release(kind, words, me)
        mine += 1


def jain_index(counts: Sequence[int]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1.0 when all equal, 1/n
    when one thread has everything. 1.0 for an empty or all-zero sequence."""
    total = sum(counts)
    squares = sum(c * c for c in counts)
    if not counts or squares == 0:
        return 1.0
    return total * total / (len(counts) * squares)


@dataclass(frozen=True)
class ContentionResult:
    """One contention run: which lock, each thread's acquisitions, and the wall time."""

    lock: str
    acquisitions: tuple[int, ...]
    counter: int
    seconds: float

    @property
    def total(self) -> int:
        """Acquisitions by all threads."""
        return sum(self.acquisitions)

    @property
    def throughput(self) -> float:
        """Acquisitions per second, all threads together."""
        return self.total / self.seconds if self.seconds > 0 else float("inf")

    @property
    def fairness(self) -> float:
        """Jain's index over :attr:`acquisitions`."""
        return jain_index(self.acquisitions)


def _run(lock: SpinLock, threads: int, kernel: Any, amount: int) -> ContentionResult:
    if threads < 1:
        raise ValueError("threads must be at least 1")
    # Warm-up: compile or load the kernel now, not inside the timed region. One thread,
    # zero budget/increments: one acquire and release, leaving the lock free.
    with ExitStack() as stack:
        slot = stack.enter_context(lock.reserved_slot()) if isinstance(lock, QueueSpinLock) else 0
        kernel(lock.kind, lock.words, slot, new_words(2), 1, 0)
    shared = new_words(2)
    results = [0] * threads
    errors: list[BaseException] = []
    with ExitStack() as stack:
        if isinstance(lock, QueueSpinLock):
            slots = [stack.enter_context(lock.reserved_slot()) for _ in range(threads)]
        else:
            slots = [0] * threads

        def body(i: int) -> None:
            try:
                results[i] = int(kernel(lock.kind, lock.words, slots[i], shared, threads, amount))
            except BaseException as exc:  # reported to the caller below
                errors.append(exc)

        workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return ContentionResult(type(lock).__name__, tuple(results), int(shared[_COUNTER]), seconds)


def count_under_lock(lock: SpinLock, threads: int, increments: int) -> ContentionResult:
    """Run ``threads`` OS threads, each a ``nogil`` kernel incrementing a shared plain
    counter ``increments`` times under ``lock``. ``result.counter`` is the final count,
    which equals ``threads * increments`` exactly when the lock excludes."""
    return _run(lock, threads, _hammer, increments)


def measure_contention(lock: SpinLock, threads: int, budget: int) -> ContentionResult:
    """Run ``threads`` OS threads, each a ``nogil`` kernel taking ``lock`` and spending
    one unit of a shared ``budget`` per acquisition until it is gone. ``acquisitions``
    holds each thread's share (summing to ``budget`` when the lock excludes)."""
    return _run(lock, threads, _spend, budget)
