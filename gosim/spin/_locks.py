"""Python-side lock objects: each owns its ``words`` array and calls the kernels.

From Python, ``acquire`` is one call into a ``nogil`` kernel, so a waiting thread spins
without the GIL and the holder (which needs the GIL to run Python code) is not blocked.
Kernels use the same lock by taking ``lock.words`` (and, for MCS/CLH, a slot from
:meth:`QueueSpinLock.reserved_slot`) and calling the functions in ``_kernels``.
"""

from __future__ import annotations

import abc
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from gosim.atomic import atomic_load, atomic_store

from . import _kernels as k

__all__ = [
    "CLHLock",
    "MCSLock",
    "QueueSpinLock",
    "RuntimeLock",
    "SpinLock",
    "TASLock",
    "TTASLock",
    "TicketLock",
    "new_words",
]

_ALIGN = k.LINE_WORDS * 8  # bytes


def new_words(lines: int) -> npt.NDArray[np.int64]:
    """A zeroed int64 array of ``lines`` lines, starting on a 128-byte boundary so each
    line is a cache-line pair of its own."""
    raw = np.zeros(lines * k.LINE_WORDS + k.LINE_WORDS, dtype=np.int64)
    skip = (-raw.ctypes.data % _ALIGN) // 8
    return raw[skip : skip + lines * k.LINE_WORDS]


class SpinLock(abc.ABC):
    """Base of the spinlocks: ``acquire``/``release``/``try_acquire``, ``locked``, and
    use as a context manager. Not reentrant: a thread that acquires a lock it holds
    spins forever. Releasing a lock you do not hold breaks it (RuntimeLock alone detects
    this, as Go's runtime does)."""

    __slots__ = ("__weakref__", "words")

    #: The kind number that ``spin_acquire(kind, words, me)`` dispatches on.
    kind: ClassVar[int]
    #: How many lines the words array needs, for locks without slots.
    lines: ClassVar[int] = 1

    # Invariant: words is 128-byte aligned, C-contiguous int64, and only ever modified
    # through the kernels' atomic operations.
    words: npt.NDArray[np.int64]

    def __init__(self) -> None:
        self.words = new_words(self.lines)

    @abc.abstractmethod
    def acquire(self) -> None:
        """Spin (without the GIL) until the lock is held by the caller."""
        raise NotImplementedError

    @abc.abstractmethod
    def try_acquire(self) -> bool:
        """Take the lock if that needs no waiting; return whether it was taken."""
        raise NotImplementedError

    @abc.abstractmethod
    def release(self) -> None:
        """Release the lock, which the caller must hold."""
        raise NotImplementedError

    @abc.abstractmethod
    def locked(self) -> bool:
        """Whether some thread holds the lock (a snapshot; it may change at once)."""
        raise NotImplementedError

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "locked" if self.locked() else "unlocked"
        return f"<{type(self).__name__} {state}>"


class TASLock(SpinLock):
    """Test-and-set: every poll is an atomic exchange on the one lock word.

    Fairness: none; whoever's exchange lands first wins, and the releasing thread,
    which still has the line in its cache, often wins again. Cache: every waiter's poll
    is a write, so the line ping-pongs between all waiting cores and slows the holder's
    release; the worst of the family under contention.
    """

    __slots__ = ()
    kind = k.TAS

    def acquire(self) -> None:
        k.tas_acquire(self.words)

    def try_acquire(self) -> bool:
        return bool(k.tas_try_acquire(self.words))

    def release(self) -> None:
        k.tas_release(self.words)

    def locked(self) -> bool:
        return bool(atomic_load(self.words, 0) != 0)


class TTASLock(TASLock):
    """Test-and-test-and-set with exponential backoff.

    A waiter tests with a plain load, which hits its own shared copy of the line, and
    tries the exchange only when the lock looks free; every failed test or lost race
    doubles a pause-count backoff (4 up to 1024 pauses, about 8 µs). Fairness: none
    per acquisition; a backed-off waiter leaves the lock to the thread that has it in
    cache, so ownership passes in bursts, and with equal threads the bursts even out
    over time. Cache: the line stays in the holder's cache for a whole burst: the
    highest throughput of the family, bought with acquisition latency up to the cap.
    """

    __slots__ = ()
    kind = k.TTAS

    def acquire(self) -> None:
        k.ttas_acquire(self.words)


class TicketLock(SpinLock):
    """Ticket lock: ``fetch_add`` on ``next`` draws a ticket; wait until ``serving``
    equals it; release increments ``serving``.

    Fairness: strict FIFO by ticket, no starvation. Cache: all waiters poll the one
    ``serving`` line, so each release invalidates every waiter's copy (O(waiters)
    traffic per hand-over); ``next`` lives on its own line so arrivals do not disturb
    the pollers. FIFO hand-over also means a descheduled next-in-line stalls everyone,
    which is why waiters start yielding after a bounded spin.
    """

    __slots__ = ()
    kind = k.TICKET
    lines = 2

    def acquire(self) -> None:
        k.ticket_acquire(self.words)

    def try_acquire(self) -> bool:
        return bool(k.ticket_try_acquire(self.words))

    def release(self) -> None:
        k.ticket_release(self.words)

    def locked(self) -> bool:
        return bool(atomic_load(self.words, 0) != atomic_load(self.words, k.LINE_WORDS))


class _SlotLease:
    """A slot held by one Python thread for as long as the thread lives."""

    __slots__ = ("__weakref__", "slot")

    def __init__(self, pool: _SlotPool) -> None:
        self.slot = pool.take()
        weakref.finalize(self, pool.give, self.slot)


class _SlotPool:
    """Hands out the slots ``[0, n)`` of a queue lock: one per Python thread that uses
    the lock (returned when the thread ends), or one per :meth:`reserved` block."""

    __slots__ = ("_free", "_local", "_lock", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        # Invariant: _free holds each slot not leased to a thread nor reserved, once.
        self._free = list(range(size - 1, -1, -1))
        self._lock = threading.Lock()
        self._local = threading.local()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(f"spin: all {self.size} slots of the lock are in use")
            return self._free.pop()

    def give(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    def current(self) -> int:
        lease: _SlotLease | None = getattr(self._local, "lease", None)
        if lease is None:
            lease = _SlotLease(self)
            self._local.lease = lease
        return lease.slot


class QueueSpinLock(SpinLock):
    """A queue lock (MCS, CLH): each waiter has a node of its own, identified by a slot.

    Python threads get a slot automatically (held until the thread ends). A kernel
    needs one per thread it runs on: ``with lock.reserved_slot() as me:`` and pass
    ``me`` to ``mcs_acquire(lock.words, me)`` etc. At most ``max_threads`` threads and
    reservations at once; one more raises RuntimeError.
    """

    __slots__ = ("_slots",)

    _slots: _SlotPool

    def __init__(self, max_threads: int = max(64, 4 * (os.cpu_count() or 1))) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._slots = _SlotPool(max_threads)
        self.words = new_words(self._lines_for(max_threads))
        self._init_words(max_threads)

    @property
    def max_threads(self) -> int:
        """Slots available: threads (and reservations) that may use the lock at once."""
        return self._slots.size

    @abc.abstractmethod
    def _lines_for(self, slots: int) -> int:
        """How many 128-byte lines the words array needs for ``slots`` waiters."""
        raise NotImplementedError

    def _init_words(self, slots: int) -> None:
        pass

    @contextmanager
    def reserved_slot(self) -> Iterator[int]:
        """Reserve a slot for a kernel thread for the duration of the block."""
        slot = self._slots.take()
        try:
            yield slot
        finally:
            self._slots.give(slot)


class MCSLock(QueueSpinLock):
    """MCS queue lock (Mellor-Crummey and Scott, 1991): swap yourself into the tail,
    link behind your predecessor, spin on a flag in your *own* node; the releaser
    clears its successor's flag.

    Fairness: strict FIFO. Cache: each waiter spins on its own line, so a hand-over
    moves O(1) lines whatever the number of waiters; the cost is a node per thread and
    a release that must wait for a successor caught mid-enqueue.
    """

    __slots__ = ()
    kind = k.MCS

    def _lines_for(self, slots: int) -> int:
        return 1 + slots

    def acquire(self) -> None:
        k.mcs_acquire(self.words, self._slots.current())

    def try_acquire(self) -> bool:
        return bool(k.mcs_try_acquire(self.words, self._slots.current()))

    def release(self) -> None:
        k.mcs_release(self.words, self._slots.current())

    def locked(self) -> bool:
        return bool(atomic_load(self.words, 0) != 0)


class CLHLock(QueueSpinLock):
    """CLH queue lock (Craig; Landin and Hagersten, 1993-94): swap your node into the
    tail and spin on your *predecessor's* node; releasing clears your node, and you
    adopt the predecessor's node for next time.

    Fairness: strict FIFO. Cache: each waiter spins on one line only its predecessor
    writes, O(1) traffic per hand-over, and unlike MCS the release never waits (no
    successor link to wait for). Nodes migrate between threads, so on NUMA machines the
    polled line is often remote; on one socket that costs nothing.

    ``try_acquire`` succeeds only when the lock is free: it compare-and-swaps the tail
    from a released node to its own. Because nodes are recycled, the tail word carries
    a per-enqueue tag besides the node id, so the swap fails if anyone enqueued since
    the look (an untagged id could be back in the tail, locked: the ABA problem). At
    most :data:`~gosim.spin._kernels.CLH_MAX_SLOTS` slots.
    """

    __slots__ = ()
    kind = k.CLH

    def _lines_for(self, slots: int) -> int:
        if slots > k.CLH_MAX_SLOTS:
            raise ValueError(f"a CLH lock has at most {k.CLH_MAX_SLOTS} slots")
        return 2 + 2 * slots

    def _init_words(self, slots: int) -> None:
        # Node `slots` is the initial, released dummy node in the tail; slot k owns
        # node k. Done before any thread can see the lock, so plain stores suffice.
        self.words[0] = slots
        for slot in range(slots):
            self.words[(2 + slots + slot) * k.LINE_WORDS] = slot

    def acquire(self) -> None:
        k.clh_acquire(self.words, self._slots.current())

    def try_acquire(self) -> bool:
        return bool(k.clh_try_acquire(self.words, self._slots.current()))

    def release(self) -> None:
        k.clh_release(self.words, self._slots.current())

    def locked(self) -> bool:
        return bool(k.clh_locked(self.words))


class RuntimeLock(SpinLock):
    """Go's runtime lock (``lock_futex.go``: ``lock2``/``unlock2``), not a pure spinlock.

    Policy: one speculative exchange; then, on a multiprocessor, 4 rounds of polling
    with 30 pauses (``procyield``) between rounds; one round ending in ``osyield``; then
    mark the key ``MUTEX_SLEEPING`` and sleep on a futex until ``unlock2`` wakes one
    sleeper. Fairness: none (a newcomer's speculative exchange can beat a woken
    sleeper) but no unbounded spinning: a long wait costs no CPU. Cache: like TTAS while
    spinning. Releasing an unlocked RuntimeLock raises UnlockOfUnlockedError, as Go
    throws "unlock of unlocked lock".
    """

    __slots__ = ()
    kind = k.RUNTIME

    def __init__(self, *, ncpu: int | None = None) -> None:
        super().__init__()
        cpus = (os.cpu_count() or 1) if ncpu is None else ncpu
        # Go: "On uniprocessors, no point spinning."
        atomic_store(self.words, 1, k.ACTIVE_SPIN if cpus > 1 else 0)

    def acquire(self) -> None:
        k.lock2(self.words)

    def try_acquire(self) -> bool:
        return bool(k.lock2_try(self.words))

    def release(self) -> None:
        k.unlock2(self.words)

    def locked(self) -> bool:
        return bool(atomic_load(self.words, 0) != k.MUTEX_UNLOCKED)


def _all_kinds() -> dict[int, type[SpinLock]]:
    return {cls.kind: cls for cls in (TASLock, TTASLock, TicketLock, MCSLock, CLHLock, RuntimeLock)}


LOCK_CLASSES: dict[int, type[SpinLock]] = _all_kinds()
